//! Turning rounds of measurements into the report: medians per scenario, ratios against the
//! baselines of the same round (then the median of those ratios), the issue's targets, a text
//! table, a JSON file and an SVG chart.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::measure::{median, CpuUse};
use crate::scenario::{Kind, Measurement, Scenario};

/// Medians of one scenario over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The scenario.
    pub scenario: Scenario,
    /// Its label.
    pub label: String,
    /// Rounds measured.
    pub rounds: usize,
    /// Median msg/s.
    pub msgs_per_sec: f64,
    /// Lowest msg/s of a round.
    pub msgs_per_sec_min: f64,
    /// Highest msg/s of a round.
    pub msgs_per_sec_max: f64,
    /// Median of the rounds' p50 latency.
    pub p50_ms: f64,
    /// Median of the rounds' p99 latency.
    pub p99_ms: f64,
    /// Median messages per segment row.
    pub msgs_per_segment: Option<f64>,
    /// Highest peak RSS of the broker over the rounds, MiB.
    pub peak_rss_mib: Option<f64>,
    /// Median cores used by party.
    pub cpu: CpuUse,
    /// Median WAL bytes per message.
    pub wal_bytes_per_msg: f64,
    /// CPU (broker + PostgreSQL + load generator) per message, microseconds.
    pub cpu_us_per_msg: f64,
    /// Against baseline (1) with the same partitions and dedup.
    pub vs_segments: Option<Versus>,
    /// ... against (1+), the broker's transaction shape by SQL.
    pub vs_segment_txn: Option<Versus>,
    /// ... against baseline (2), naive with the unique dedup index.
    pub vs_naive: Option<Versus>,
    /// ... against (2'), naive without a dedup index.
    pub vs_naive_plain: Option<Versus>,
    /// Failed requests over all rounds.
    pub errors: u64,
    /// Items not `queued` over all rounds.
    pub not_queued: u64,
    /// Rounds whose stored count did not match.
    pub unverified: usize,
}

/// A comparison with a baseline: medians of per-round ratios.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Versus {
    /// msg/s over the baseline's msg/s.
    pub throughput: f64,
    /// msg per CPU-second over the baseline's.
    pub per_cpu: Option<f64>,
}

/// Everything measured, by scenario and round.
pub struct Results {
    /// Every measurement in the order taken.
    pub all: Vec<Measurement>,
}

impl Results {
    fn of(&self, s: Scenario) -> Vec<&Measurement> {
        self.all.iter().filter(|m| m.scenario == s).collect()
    }

    /// The median over rounds of `a`'s msg/s divided by `b`'s in the same round.
    pub fn ratio(&self, a: Scenario, b: Scenario) -> Option<f64> {
        self.ratio_of(a, b, |m| m.msgs_per_sec)
    }

    /// The same for messages per CPU-second (broker + PostgreSQL + load generator): what the
    /// ratio would be if both had been given the same CPU.
    pub fn cpu_ratio(&self, a: Scenario, b: Scenario) -> Option<f64> {
        self.ratio_of(a, b, |m| m.msgs_per_sec / m.cpu.ours())
    }

    fn ratio_of(&self, a: Scenario, b: Scenario, f: fn(&Measurement) -> f64) -> Option<f64> {
        let by_round: HashMap<usize, f64> = self.of(b).iter().map(|m| (m.round, f(m))).collect();
        let ratios: Vec<f64> = self
            .of(a)
            .iter()
            .filter_map(|m| {
                let base = by_round.get(&m.round)?;
                (*base > 0.0 && base.is_finite()).then(|| f(m) / base)
            })
            .collect();
        let r = median(&ratios);
        r.is_finite().then_some(r)
    }

    fn versus(&self, a: Scenario, b: Scenario) -> Option<Versus> {
        Some(Versus {
            throughput: self.ratio(a, b)?,
            per_cpu: self.cpu_ratio(a, b),
        })
    }

    /// One row per scenario, in first-measured order.
    pub fn rows(&self) -> Vec<Row> {
        let mut seen = Vec::new();
        for m in &self.all {
            if !seen.contains(&m.scenario) {
                seen.push(m.scenario);
            }
        }
        seen.into_iter().map(|s| self.row(s)).collect()
    }

    fn row(&self, s: Scenario) -> Row {
        let ms = self.of(s);
        let pick =
            |f: &dyn Fn(&Measurement) -> f64| median(&ms.iter().map(|m| f(m)).collect::<Vec<_>>());
        let rates: Vec<f64> = ms.iter().map(|m| m.msgs_per_sec).collect();
        let segs = pick(&|m| m.msgs_per_segment.unwrap_or(f64::NAN));
        let rss = ms
            .iter()
            .filter_map(|m| m.peak_rss_mib)
            .fold(f64::NAN, f64::max);
        let base = |kind: Kind, dedup: bool| Scenario {
            kind,
            partitions: s.partitions,
            dedup,
        };
        let (vs_segments, vs_segment_txn, vs_naive, vs_naive_plain) = match s.kind {
            Kind::Broker { .. } => (
                self.versus(s, base(Kind::SegmentRows, s.dedup)),
                self.versus(s, base(Kind::SegmentTxn, s.dedup)),
                self.versus(s, base(Kind::Naive, true)),
                self.versus(s, base(Kind::Naive, false)),
            ),
            Kind::SegmentTxn => (
                self.versus(s, base(Kind::SegmentRows, s.dedup)),
                None,
                self.versus(s, base(Kind::Naive, true)),
                self.versus(s, base(Kind::Naive, false)),
            ),
            Kind::SegmentRows => (
                None,
                None,
                self.versus(s, base(Kind::Naive, true)),
                self.versus(s, base(Kind::Naive, false)),
            ),
            Kind::Naive => (None, None, None, None),
        };
        Row {
            scenario: s,
            label: s.label(),
            rounds: ms.len(),
            msgs_per_sec: median(&rates),
            msgs_per_sec_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
            msgs_per_sec_max: rates.iter().copied().fold(0.0, f64::max),
            p50_ms: pick(&|m| m.p50_ms),
            p99_ms: pick(&|m| m.p99_ms),
            msgs_per_segment: segs.is_finite().then_some(segs),
            peak_rss_mib: rss.is_finite().then_some(rss),
            cpu: CpuUse {
                broker: pick(&|m| m.cpu.broker),
                postgres: pick(&|m| m.cpu.postgres),
                load: pick(&|m| m.cpu.load),
                other: pick(&|m| m.cpu.other),
                cores: pick(&|m| m.cpu.cores),
            },
            wal_bytes_per_msg: pick(&|m| m.wal_bytes_per_msg),
            cpu_us_per_msg: pick(&|m| m.cpu.ours() / m.msgs_per_sec * 1e6),
            vs_segments,
            vs_segment_txn,
            vs_naive,
            vs_naive_plain,
            errors: ms.iter().map(|m| m.errors).sum(),
            not_queued: ms.iter().map(|m| m.not_queued).sum(),
            unverified: ms.iter().filter(|m| !m.verified).count(),
        }
    }

    /// The issue's targets, evaluated at `partitions` (100 when measured).
    pub fn targets(&self, partitions: u64) -> Vec<Target> {
        let broker = |batch, dedup| Scenario {
            kind: Kind::Broker { batch },
            partitions,
            dedup,
        };
        let base = |kind, dedup| Scenario {
            kind,
            partitions,
            dedup,
        };
        let mut out = Vec::new();
        if let Some(r) = self.ratio(broker(100, true), base(Kind::SegmentRows, true)) {
            let mut notes = Vec::new();
            if let Some(c) = self.cpu_ratio(broker(100, true), base(Kind::SegmentRows, true)) {
                notes.push(format!("per CPU-second vs (1): {c:.2}×"));
            }
            if let Some(p) = self.ratio(broker(100, true), base(Kind::SegmentTxn, true)) {
                notes.push(format!("vs (1+) the broker's transaction by SQL: {p:.2}×"));
            }
            let txn = notes.join("; ");
            out.push(Target {
                name: format!("batch 100, {partitions} partitions, dedup on vs baseline (1)"),
                value: r,
                goal: "≥ 0.70×".into(),
                met: r >= 0.70,
                note: txn,
            });
        }
        if let Some(r) = self.ratio(broker(100, false), base(Kind::Naive, true)) {
            let mut notes = Vec::new();
            if let Some(c) = self.cpu_ratio(broker(100, false), base(Kind::Naive, true)) {
                notes.push(format!("per CPU-second vs (2): {c:.2}×"));
            }
            if let Some(p) = self.ratio(broker(100, false), base(Kind::Naive, false)) {
                notes.push(format!("vs (2') naive without the unique index: {p:.2}×"));
            }
            let plain = notes.join("; ");
            out.push(Target {
                name: format!("batch 100, {partitions} partitions, dedup off vs naive (2)"),
                value: r,
                goal: "≥ 1.00×".into(),
                met: r >= 1.0,
                note: plain,
            });
        }
        if let Some(r) = self.ratio(broker(1, true), broker(100, true)) {
            let note = self
                .ratio(broker(1, false), broker(100, false))
                .map_or(String::new(), |off| format!("with dedup off: {off:.2}×"));
            out.push(Target {
                name: format!("batch 1 vs batch 100 ({partitions} partitions, dedup on)"),
                value: r,
                goal: "≥ 0.20×".into(),
                met: r >= 0.20,
                note,
            });
        }
        let b1 = self.of(broker(1, true));
        if !b1.is_empty() {
            let p99 = median(&b1.iter().map(|m| m.p99_ms).collect::<Vec<_>>());
            out.push(Target {
                name: format!("batch 1 p99 latency ({partitions} partitions, dedup on)"),
                value: p99,
                goal: "< 20 ms".into(),
                met: p99 < 20.0,
                note: "milliseconds".into(),
            });
        }
        let rss = self
            .all
            .iter()
            .filter_map(|m| m.peak_rss_mib.map(|r| (r, m.scenario)))
            .fold(None, |acc: Option<(f64, Scenario)>, (r, s)| match acc {
                Some((best, _)) if best >= r => acc,
                _ => Some((r, s)),
            });
        if let Some((mib, s)) = rss {
            out.push(Target {
                name: "broker peak RSS (highest of all broker runs)".into(),
                value: mib * 1.048_576,
                goal: "≤ 50 MB".into(),
                met: mib * 1.048_576 <= 50.0,
                note: {
                    let small = self
                        .all
                        .iter()
                        .filter(|m| m.scenario.partitions <= 100)
                        .filter_map(|m| m.peak_rss_mib)
                        .fold(f64::NAN, f64::max);
                    if small.is_finite() && s.partitions > 100 {
                        format!(
                            "MB, in {}; highest with ≤ 100 partitions: {:.1} MB",
                            s.label(),
                            small * 1.048_576
                        )
                    } else {
                        format!("MB, in {}", s.label())
                    }
                },
            });
        }
        out
    }
}

/// One of the issue's targets.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value (ratio, ms or MB).
    pub value: f64,
    /// The goal as text.
    pub goal: String,
    /// Whether it is met.
    pub met: bool,
    /// Extra context.
    pub note: String,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// "throughput ratio (per-CPU ratio)".
fn vs(v: Option<Versus>) -> String {
    match v {
        None => "-".into(),
        Some(Versus {
            throughput,
            per_cpu: Some(c),
        }) => format!("{throughput:.2} ({c:.2})"),
        Some(v) => format!("{:.2}", v.throughput),
    }
}

fn kilo(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// The results table, as Markdown (readable as plain text too).
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | msg/s (median) | min–max | p50 ms | p99 ms | msg/segment | broker RSS MB | CPU cores broker/pg/load/other | CPU µs/msg | WAL B/msg | vs (1) | vs (1+) | vs (2) | vs (2') |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let mut flags = String::new();
        if r.errors > 0 || r.not_queued > 0 {
            let _ = write!(flags, " ⚠{} err/{} not queued", r.errors, r.not_queued);
        }
        if r.unverified > 0 {
            let _ = write!(flags, " ⚠unverified×{}", r.unverified);
        }
        let _ = writeln!(
            out,
            "| `{}`{} | {} | {}–{} | {:.1} | {:.1} | {} | {} | {:.2}/{:.2}/{:.2}/{:.2} | {:.0} | {:.0} | {} | {} | {} | {} |",
            r.label,
            flags,
            kilo(r.msgs_per_sec),
            kilo(r.msgs_per_sec_min),
            kilo(r.msgs_per_sec_max),
            r.p50_ms,
            r.p99_ms,
            opt(r.msgs_per_segment, 1),
            opt(r.peak_rss_mib.map(|m| m * 1.048_576), 1),
            r.cpu.broker,
            r.cpu.postgres,
            r.cpu.load,
            r.cpu.other,
            r.cpu_us_per_msg,
            r.wal_bytes_per_msg,
            vs(r.vs_segments),
            vs(r.vs_segment_txn),
            vs(r.vs_naive),
            vs(r.vs_naive_plain),
        );
    }
    out
}

/// The targets, one line each.
pub fn targets_text(targets: &[Target]) -> String {
    let mut out = String::new();
    for t in targets {
        let _ = writeln!(
            out,
            "- [{}] {}: {:.2} (goal {}){}",
            if t.met { "met" } else { "MISSED" },
            t.name,
            t.value,
            t.goal,
            if t.note.is_empty() {
                String::new()
            } else {
                format!(" — {}", t.note)
            }
        );
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart of msg/s (median, with the rounds' min–max as a whisker), grouped by
/// partitions and dedup; baselines in grey, the broker in blue.
pub fn svg(rows: &[Row], title: &str) -> String {
    let mut groups: Vec<(u64, bool)> = Vec::new();
    for r in rows {
        if matches!(r.scenario.kind, Kind::Broker { .. } | Kind::SegmentRows)
            && !groups.contains(&(r.scenario.partitions, r.scenario.dedup))
        {
            groups.push((r.scenario.partitions, r.scenario.dedup));
        }
    }
    let find = |kind: Kind, p: u64, d: bool| {
        rows.iter().find(|r| {
            r.scenario.kind == kind && r.scenario.partitions == p && r.scenario.dedup == d
        })
    };
    let mut batches: Vec<usize> = rows
        .iter()
        .filter_map(|r| match r.scenario.kind {
            Kind::Broker { batch } => Some(batch),
            _ => None,
        })
        .collect();
    batches.sort_unstable_by(|a, b| b.cmp(a));
    batches.dedup();

    struct Bar<'a> {
        label: String,
        row: &'a Row,
        color: &'static str,
    }
    let mut layout: Vec<(String, Vec<Bar>)> = Vec::new();
    for &(p, d) in &groups {
        let mut bars = Vec::new();
        if let Some(r) = find(Kind::SegmentRows, p, d) {
            bars.push(Bar {
                label: "(1) segment rows, SQL".into(),
                row: r,
                color: "#8d8d8d",
            });
        }
        if let Some(r) = find(Kind::SegmentTxn, p, d) {
            bars.push(Bar {
                label: "(1+) broker's txn, SQL".into(),
                row: r,
                color: "#b0b0b0",
            });
        }
        // (2) is the naive baseline for both dedup settings; (2') only applies without dedup.
        let naive: &[bool] = if d { &[true] } else { &[true, false] };
        for &unique in naive {
            if let Some(r) = find(Kind::Naive, p, unique) {
                let label = if unique {
                    "(2) naive + unique index"
                } else {
                    "(2') naive, no index"
                };
                bars.push(Bar {
                    label: label.into(),
                    row: r,
                    color: if unique { "#d6d6d6" } else { "#e8e8e8" },
                });
            }
        }
        for (n, b) in batches.iter().enumerate() {
            if let Some(r) = find(Kind::Broker { batch: *b }, p, d) {
                let color = ["#0d47a1", "#1976d2", "#64b5f6", "#90caf9"][n.min(3)];
                bars.push(Bar {
                    label: format!("broker, batch {b}"),
                    row: r,
                    color,
                });
            }
        }
        let name = format!(
            "{p} partition{}, dedup {}",
            if p == 1 { "" } else { "s" },
            if d { "on" } else { "off" }
        );
        layout.push((name, bars));
    }
    let max = rows.iter().map(|r| r.msgs_per_sec_max).fold(1.0, f64::max);
    let step = nice_step(max / 6.0);
    let top = (max / step).ceil() * step;

    let (width, left, right, bar_h, gap, group_gap, head) =
        (980.0, 230.0, 90.0, 15.0, 3.0, 30.0, 70.0);
    let plot_w = width - left - right;
    let n_bars: usize = layout.iter().map(|(_, b)| b.len()).sum();
    let height = head + layout.len() as f64 * group_gap + n_bars as f64 * (bar_h + gap) + 40.0;
    let x = |v: f64| left + v / top * plot_w;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/><text x="{left}" y="24" font-size="15" font-weight="bold">{}</text><text x="{left}" y="42" fill="#555">messages stored per second (median of rounds; whisker: lowest–highest round)</text>"##,
        esc(title)
    );
    let axis_bottom = height - 30.0;
    let mut t = 0.0;
    while t <= top + step / 2.0 {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{head}" x2="{xx:.1}" y2="{axis_bottom:.1}" stroke="#e6e6e6"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            axis_bottom + 16.0,
            if t >= 1000.0 {
                format!("{}k", t / 1000.0)
            } else {
                format!("{t}")
            }
        );
        t += step;
    }
    let mut y = head;
    for (name, bars) in &layout {
        y += group_gap;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{:.1}" font-weight="bold">{}</text>"#,
            y - 8.0,
            esc(name)
        );
        for bar in bars {
            let r = bar.row;
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{left}" y="{y:.1}" width="{:.1}" height="{bar_h}" fill="{}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" fill="#222">{}</text>"##,
                left - 8.0,
                y + bar_h - 3.0,
                esc(&bar.label),
                (x(r.msgs_per_sec) - left).max(0.5),
                bar.color,
                x(r.msgs_per_sec_min),
                y + bar_h / 2.0,
                x(r.msgs_per_sec_max),
                y + bar_h / 2.0,
                x(r.msgs_per_sec_max) + 5.0,
                y + bar_h - 3.0,
                kilo(r.msgs_per_sec)
            );
            y += bar_h + gap;
        }
    }
    s.push_str("</svg>\n");
    s
}

fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if raw <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}
