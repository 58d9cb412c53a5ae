//! What is measured: the scenarios ([`Kind`], [`Scenario`]) and the parameters every
//! measurement of a run shares ([`Params`]). The suites (push, spool, consume), the runner and
//! the report import it; it imports none of them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

/// What is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Baseline (1): the broker's rows (segments + dedup sidecar) inserted by SQL.
    SegmentRows,
    /// Baseline (1+): the same rows through the broker's commit transaction, one segment each.
    SegmentTxn,
    /// Baseline (2): one row per message; `dedup` means the unique (partition, txn) index.
    Naive,
    /// Baseline (3): one message per commit (an autocommit INSERT of one row with the unique
    /// index) from `--connections` connections: the database's raw single-row commit rate,
    /// what a broker that commits each push on its own can reach at best (Queen 0.15 does);
    /// the batch-1 target's baseline.
    SingleCommits,
    /// The broker, `batch` items per push request.
    Broker {
        /// Items per request.
        batch: usize,
    },
    /// The broker with PostgreSQL taken away: pushes answered `buffered` (spool) against
    /// `queued` with the same broker just before, then the replay's drain rate.
    Spool {
        /// Items per request.
        batch: usize,
    },
    /// Consumers only, on a pre-filled queue: pop `batch` (no long-poll) + ack batch.
    PopAck {
        /// Messages per pop.
        batch: usize,
    },
    /// Producers (push `batch`) and consumers (long-poll pop [`POP_BATCH`] + ack batch)
    /// together.
    EndToEnd {
        /// Items per push.
        batch: usize,
        /// 0: producers push as fast as they are answered; else they offer this percentage of
        /// the same round's push-only rate (batch `batch`), on a fixed schedule.
        pace_pct: u32,
    },
    /// [`Kind::Broker`] to a queue with `encryptionEnabled` (the broker has a key): what
    /// sealing each payload costs on the push path.
    EncryptedPush {
        /// Items per request.
        batch: usize,
    },
    /// [`Kind::PopAck`] on a queue with `encryptionEnabled`: what opening each payload costs
    /// on the pop path.
    EncryptedPopAck {
        /// Messages per pop.
        batch: usize,
    },
    /// Several broker processes on one database, the load spread over them
    /// (`crate::brokers`): push only, or producers and consumers together.
    Brokers {
        /// Broker processes.
        brokers: usize,
        /// Producers and consumers together (else push only).
        end_to_end: bool,
    },
    /// Long-poll wake-up: one consumer waits (`wait=true`) on the empty queue, one message is
    /// pushed; push answered → pop answered, [`Params::wakeups`] times.
    Wakeup,
    /// The autopilot suite (`crate::autopilot`): [`Params::consumers`] consumers popping the
    /// queue as `pop` says, + ack batch, either on a queue filled first with
    /// [`Params::autopilot_prefill`] messages (`live_rate` 0, the backlog) or while paced
    /// producers push `live_rate` msg/s in pushes of [`LIVE_PUSH_BATCH`] (the live stream).
    Autopilot {
        /// How the consumers pop.
        pop: PopStyle,
        /// 0: backlog; else msg/s the producers offer meanwhile.
        live_rate: u32,
    },
}

/// How the consumers of a consuming measurement pop (`crate::traffic::consumers_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PopStyle {
    /// `batch=N`, with a long poll (`wait=true&timeout=1000`) or without (`wait=false`; after
    /// an empty answer the consumer pauses 2 ms).
    Fixed {
        /// Messages per pop.
        batch: usize,
        /// Long poll.
        wait: bool,
    },
    /// `autopilot=true` and neither `batch` nor `partitions`: the broker sizes both and echoes
    /// `autopilot: {partitions, batch, waitMs}`. `wait` as for [`PopStyle::Fixed`]. After an
    /// empty answer of a pop without `wait`, `honour_wait` sleeps the echoed `waitMs` (100 ms
    /// without an echo or with 0, as the 2.x consume loop); without it, the consumer pops
    /// again at once. After an empty long poll it pops again at once either way (the client).
    Autopilot {
        /// Long poll.
        wait: bool,
        /// Sleep the advised `waitMs` after an empty non-waiting pop.
        honour_wait: bool,
    },
}

impl PopStyle {
    /// Whether the broker sizes the pops.
    pub fn autopilot(&self) -> bool {
        matches!(self, PopStyle::Autopilot { .. })
    }

    /// A short label: `batch 100, wait=false`, `autopilot, wait=false, honours waitMs`, ...
    pub fn label(&self) -> String {
        match *self {
            PopStyle::Fixed { batch, wait } => format!("batch {batch}, wait={wait}"),
            PopStyle::Autopilot { wait: true, .. } => "autopilot, wait=true".into(),
            PopStyle::Autopilot {
                wait: false,
                honour_wait: true,
            } => "autopilot, wait=false, honours waitMs".into(),
            PopStyle::Autopilot {
                wait: false,
                honour_wait: false,
            } => "autopilot, wait=false, ignores waitMs".into(),
        }
    }
}

/// Items per push of the autopilot suite's live stream: small pushes, so that messages
/// arrive as a stream rather than in a few large blocks.
pub const LIVE_PUSH_BATCH: usize = 10;

/// Messages per pop of the consuming scenarios.
pub const POP_BATCH: usize = 100;

/// Items per push of a paced end-to-end run offering `pace_pct` % of push-only: 100, but 10
/// below 10 %, so that each producer still pushes several times a second (64 producers at 5 %
/// of 100k msg/s: one request of 10 every 128 ms each, instead of one of 100 every 1.3 s).
pub fn paced_push_batch(pace_pct: u32) -> usize {
    if pace_pct < 10 {
        10
    } else {
        100
    }
}

/// A workload: what, on how many partitions, dedup on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Scenario {
    /// What is measured.
    pub kind: Kind,
    /// Partitions written (each request/transaction picks one at random).
    pub partitions: u64,
    /// Dedup on (broker, baseline 1: window 3600 s; baseline 2: the unique index).
    pub dedup: bool,
}

/// The key the broker gets in the encryption scenarios (any 64 hex characters will do).
pub const BENCH_KEY: &str = "4242424242424242424242424242424242424242424242424242424242424242";

impl Kind {
    /// Whether the queue of this scenario has `encryptionEnabled`.
    pub fn encrypted(&self) -> bool {
        matches!(
            self,
            Kind::EncryptedPush { .. } | Kind::EncryptedPopAck { .. }
        )
    }

    /// Whether consumers are measured (the consuming table's rows).
    pub fn is_consuming(&self) -> bool {
        matches!(
            self,
            Kind::PopAck { .. } | Kind::EncryptedPopAck { .. } | Kind::EndToEnd { .. }
        )
    }
}

/// The broker's environment for `kind`: `extra` plus the key for the encryption scenarios.
pub fn broker_env(extra: &[(String, String)], kind: Kind) -> Vec<(String, String)> {
    let mut env = extra.to_vec();
    if kind.encrypted() {
        env.push(("QUEEN_ENCRYPTION_KEY".into(), BENCH_KEY.into()));
    }
    env
}

impl Scenario {
    /// A one-line label.
    pub fn label(&self) -> String {
        let d = if self.dedup { "on" } else { "off" };
        let p = self.partitions;
        match self.kind {
            Kind::Broker { batch } => format!("broker, batch {batch}, P={p}, dedup {d}"),
            Kind::Spool { batch } => {
                format!("spool: PostgreSQL down, batch {batch}, P={p}, dedup {d}")
            }
            Kind::PopAck { batch } => format!("pop+ack, batch {batch}, P={p}, dedup {d}"),
            Kind::EndToEnd { batch, pace_pct: 0 } => {
                format!("end-to-end push+pop+ack, batch {batch}, P={p}, dedup {d}")
            }
            Kind::EndToEnd { batch, pace_pct } => format!(
                "end-to-end, producers paced at {pace_pct}% of push-only, push batch {batch}, P={p}, dedup {d}"
            ),
            Kind::Wakeup => format!("long-poll wake-up, P={p}, dedup {d}"),
            Kind::Autopilot { pop, live_rate: 0 } => {
                format!("backlog: pop {}, P={p}, dedup {d}", pop.label())
            }
            Kind::Autopilot { pop, live_rate } => format!(
                "live {live_rate} msg/s: pop {}, P={p}, dedup {d}",
                pop.label()
            ),
            Kind::Brokers {
                brokers,
                end_to_end: false,
            } => format!("{brokers} broker(s), push batch 100, P={p}, dedup {d}"),
            Kind::Brokers {
                brokers,
                end_to_end: true,
            } => format!("{brokers} broker(s), end-to-end push+pop+ack, P={p}, dedup {d}"),
            Kind::EncryptedPush { batch } => {
                format!("broker, encrypted queue, batch {batch}, P={p}, dedup {d}")
            }
            Kind::EncryptedPopAck { batch } => {
                format!("pop+ack, encrypted queue, batch {batch}, P={p}, dedup {d}")
            }
            Kind::SegmentRows => format!("(1) segment rows by SQL, P={p}, dedup {d}"),
            Kind::SegmentTxn => format!("(1+) broker's txn by SQL, P={p}, dedup {d}"),
            Kind::Naive if self.dedup => format!("(2) naive + unique index, P={p}"),
            Kind::Naive => format!("(2') naive, no index, P={p}"),
            Kind::SingleCommits => format!("(3) one row per commit, P={p}"),
        }
    }
}

/// Parameters shared by every measurement of a run.
pub struct Params {
    /// Concurrent connections of the load generator.
    pub connections: usize,
    /// Connections of the SQL baselines.
    pub baseline_connections: usize,
    /// Messages per baseline transaction.
    pub baseline_batch: usize,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// The window.
    pub duration: Duration,
    /// The broker binary.
    pub broker_bin: PathBuf,
    /// Extra environment for the broker.
    pub broker_env: Vec<(String, String)>,
    /// Clock ticks per second (/proc units).
    pub ticks_per_sec: f64,
    /// Print the time each setup step takes.
    pub verbose: bool,
    /// Collect a profile (pg_stat_statements, backend states, broker commits).
    pub profile: bool,
    /// Concurrent consumers of the consuming scenarios.
    pub consumers: usize,
    /// Messages pushed before the pop+ack window.
    pub prefill: u64,
    /// Messages pushed before the autopilot suite's backlog window.
    pub autopilot_prefill: u64,
    /// Long-poll wake-up samples per round.
    pub wakeups: usize,
    /// Record a CPU profile of the whole machine (`perf record -a -g`) during each consuming
    /// window into this folder.
    pub perf_dir: Option<PathBuf>,
}

/// Prints how long a setup step took (with `--verbose`).
pub fn trace(params: &Params, what: &str, since: Instant) {
    if params.verbose {
        eprintln!(
            "      {what}: {:.0} ms",
            since.elapsed().as_secs_f64() * 1000.0
        );
    }
}
