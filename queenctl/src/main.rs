//! `queenctl`: queen-broker from the command line. Every command is one or a few calls of the
//! broker's HTTP API (`QUEEN_URL`, with `QUEEN_TOKEN` as the bearer token when auth is on).
//! Human tables by default, `--json` for scripts. Exit codes: 0 ok, 1 an error (the broker
//! refused, failed or could not be reached), 2 a usage error.

mod client;
mod commands;
mod table;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::client::Failure;

/// queen-broker from the command line.
#[derive(Parser, Debug)]
#[command(
    name = "queenctl",
    version,
    about = "queen-broker from the command line",
    after_help = "Exit codes: 0 ok, 1 error (refused, failed or unreachable broker), 2 usage error."
)]
pub struct Cli {
    /// The broker's base URL.
    #[arg(
        long,
        global = true,
        env = "QUEEN_URL",
        default_value = "http://127.0.0.1:6632"
    )]
    pub url: String,
    /// Bearer token (JWT) sent with every request.
    #[arg(long, global = true, env = "QUEEN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the broker's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for an answer (long polls wait their own timeout on top).
    #[arg(long, global = true, default_value_t = 30, value_name = "SECONDS")]
    pub request_timeout: u64,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Push a payload, or one JSON payload per line of standard input.
    Push(PushArgs),
    /// Pop messages once (optionally acknowledging them).
    Pop(PopArgs),
    /// Follow a queue: long-poll and print each message as it arrives.
    Tail(TailArgs),
    /// List, show, configure and delete queues.
    #[command(subcommand)]
    Queues(QueuesCommand),
    /// Consumer groups: list, lag, seek, delete.
    #[command(subcommand)]
    Groups(GroupsCommand),
    /// Dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Maintenance mode (pushes spooled) and pop maintenance (pops answer empty).
    Maintenance(MaintenanceArgs),
    /// The broker's readiness and database connection (exit 1 when unhealthy).
    Health,
    /// A short summary of the broker's metrics.
    Metrics,
    /// The KV store: read, write and list keys; namespaces.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Live lock and semaphore permits: holder, token, expiry.
    Locks,
    /// Pending timers per queue: count, next due, lateness.
    Timers,
    /// Stream queries: partitions with state, state size, cycles, last cycle.
    Streams,
    /// Kafka topics (partitions, offsets) and groups (members, committed offsets, lag).
    #[command(subcommand)]
    Kafka(KafkaCommand),
}

/// `queues list`.
#[derive(Args, Debug)]
pub struct QueueListArgs {
    /// Only queues whose name contains this (case insensitive).
    #[arg(long)]
    pub search: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Skip this many.
    #[arg(long, default_value_t = 0)]
    pub offset: u32,
}

/// `kafka ...`.
#[derive(Subcommand, Debug)]
pub enum KafkaCommand {
    /// Topics made over Kafka: partitions, log start and end offsets.
    Topics(ListArgs),
    /// Kafka groups: state, members (when they use this broker), committed offset and lag per
    /// partition.
    Groups(ListArgs),
}

/// A paged list.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only names containing this (case insensitive).
    #[arg(long)]
    pub search: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Skip this many.
    #[arg(long, default_value_t = 0)]
    pub offset: u32,
}

/// `kv ...`.
#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// One key's value, version and expiry (exit 1 when it does not exist).
    Get {
        /// Namespace.
        namespace: String,
        /// Key.
        key: String,
    },
    /// Write a key (a JSON value; quote text: '"hello"').
    Put {
        /// Namespace.
        namespace: String,
        /// Key.
        key: String,
        /// The value as JSON.
        value: String,
        /// Expire after this many seconds (else the key never expires).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<i64>,
    },
    /// Without a namespace: every namespace with its key count; with one: its keys (by prefix).
    List {
        /// Namespace whose keys to list.
        namespace: Option<String>,
        /// Only keys starting with this (needed with a namespace: the KV API reads keys by a
        /// non-empty prefix).
        #[arg(long, requires = "namespace")]
        prefix: Option<String>,
        /// At most this many keys.
        #[arg(long, default_value_t = 100, requires = "namespace")]
        limit: u32,
    },
}

/// `push`.
#[derive(Args, Debug)]
pub struct PushArgs {
    /// Queue to push to.
    pub queue: String,
    /// The payload as JSON (quote strings: '"text"'). Without it, standard input is read: one
    /// JSON payload per line.
    pub payload: Option<String>,
    /// Partition (the broker's default partition when left out).
    #[arg(long)]
    pub partition: Option<String>,
    /// Transaction id (dedup key); only with a single payload argument.
    #[arg(long)]
    pub transaction_id: Option<String>,
}

/// Where and how to pop.
#[derive(Args, Debug)]
pub struct Source {
    /// Queue to read.
    pub queue: String,
    /// Only this partition.
    #[arg(long)]
    pub partition: Option<String>,
    /// Consumer group (queue mode when left out).
    #[arg(long)]
    pub group: Option<String>,
    /// Messages per pop.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
}

/// `pop`.
#[derive(Args, Debug)]
pub struct PopArgs {
    #[command(flatten)]
    pub source: Source,
    /// Wait (long-poll) up to --wait-ms for a message instead of answering at once.
    #[arg(long)]
    pub wait: bool,
    /// How long a waiting pop waits.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub wait_ms: u64,
    /// Acknowledge the popped messages as completed.
    #[arg(long)]
    pub ack: bool,
    /// Acknowledge with this status instead: `failed` (retried until the retry limit, then
    /// dead-lettered), `dlq` (dead-lettered at once) or `retry`.
    #[arg(long, value_parser = ["completed", "failed", "dlq", "retry"])]
    pub ack_status: Option<String>,
    /// The reason stored with a `failed` or `dlq` acknowledgement.
    #[arg(long, requires = "ack_status")]
    pub error: Option<String>,
}

/// `tail`.
#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub source: Source,
    /// Acknowledge each message after printing it (else the leases simply expire).
    #[arg(long)]
    pub ack: bool,
    /// Stop after this many messages (0: follow until interrupted).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// How long each long-poll waits before asking again.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub poll_ms: u64,
}

/// `queues ...`.
#[derive(Subcommand, Debug)]
pub enum QueuesCommand {
    /// The queues with their message counts, a page at a time (highest priority first).
    List(QueueListArgs),
    /// One queue: options, totals and partitions.
    Show {
        /// Queue name.
        queue: String,
    },
    /// Create a queue or change its options (options not given keep their current value).
    Configure(ConfigureArgs),
    /// Delete a queue with its partitions and messages.
    Delete {
        /// Queue name.
        queue: String,
        /// Confirm the deletion (required).
        #[arg(long)]
        yes: bool,
    },
}

/// `queues configure`.
#[derive(Args, Debug)]
pub struct ConfigureArgs {
    /// Queue name.
    pub queue: String,
    /// Namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Task.
    #[arg(long)]
    pub task: Option<String>,
    /// Lease time in seconds.
    #[arg(long)]
    pub lease_time: Option<i64>,
    /// Retries before a message is dead-lettered.
    #[arg(long)]
    pub retry_limit: Option<i64>,
    /// Priority (higher first).
    #[arg(long)]
    pub priority: Option<i64>,
    /// Message time to live in seconds.
    #[arg(long)]
    pub ttl: Option<i64>,
    /// Further options as a JSON object (the names of POST /api/v1/configure), e.g.
    /// '{"retentionEnabled": true, "retentionSeconds": 3600}'.
    #[arg(long, value_name = "JSON")]
    pub options: Option<String>,
}

/// `groups ...`.
#[derive(Subcommand, Debug)]
pub enum GroupsCommand {
    /// Every (group, queue) pair with its lag.
    List,
    /// Lag per partition: of one group, or of every group behind by at least --min-lag-seconds.
    Lag {
        /// Group name (every group when left out).
        group: Option<String>,
        /// Without a group: only partitions whose oldest unconsumed message is this old.
        #[arg(long, default_value_t = 0)]
        min_lag_seconds: u64,
    },
    /// Move a group's cursor on a queue: to the end, or to a time.
    Seek {
        /// Group name.
        group: String,
        /// Queue name.
        queue: String,
        /// Skip everything stored now.
        #[arg(
            long,
            conflicts_with = "timestamp",
            required_unless_present = "timestamp"
        )]
        to_end: bool,
        /// Restart from the messages stored at or after this ISO-8601 time.
        #[arg(long, conflicts_with = "partition")]
        timestamp: Option<String>,
        /// Only this partition (with --to-end).
        #[arg(long)]
        partition: Option<String>,
    },
    /// Delete a group's state (cursors, leases), on one queue or on all.
    Delete {
        /// Group name.
        group: String,
        /// Only on this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Confirm the deletion (required).
        #[arg(long)]
        yes: bool,
    },
}

/// `dlq ...`.
#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// Dead letters, newest failure first.
    List {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only this consumer group.
        #[arg(long)]
        group: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Skip this many.
        #[arg(long, default_value_t = 0)]
        offset: u32,
    },
}

/// `maintenance`.
#[derive(Args, Debug)]
pub struct MaintenanceArgs {
    #[command(subcommand)]
    pub action: MaintenanceAction,
}

/// `maintenance status|on|off`.
#[derive(Subcommand, Debug)]
pub enum MaintenanceAction {
    /// Both modes and the spooled item count.
    Status,
    /// Turn a mode on.
    On {
        /// Pop maintenance instead of push maintenance.
        #[arg(long)]
        pop: bool,
    },
    /// Turn a mode off.
    Off {
        /// Pop maintenance instead of push maintenance.
        #[arg(long)]
        pop: bool,
    },
}

fn main() -> ExitCode {
    // Usage errors and --help/--version are clap's: exit 2 and 0.
    let cli = Cli::parse();
    let outcome = actix_rt::System::new().block_on(commands::run(cli));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(text)) => {
            eprintln!("queenctl: {}", table::clean(&text));
            eprintln!("Try 'queenctl --help'.");
            ExitCode::from(2)
        }
        Err(Failure::Error(text)) => {
            eprintln!("queenctl: {}", table::clean(&text));
            ExitCode::from(1)
        }
    }
}
