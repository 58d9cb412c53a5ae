//! Settings: Queen's environment variables first, then an optional TOML file in `config/`.
//!
//! [`VARIABLES`] is the one table of settings: each entry has the variable's name, its TOML key,
//! its default, what it means and how its value is read ([`Kind`]). The parser reads every value
//! through its entry (the constants in [`var`]), [`markdown_table`] renders the table for the
//! README (a test keeps the README current), and the same plain data can feed `--help`. A value
//! that does not parse stops the start with a message naming the variable. Secrets are redacted
//! in `Debug` output.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a variable's value is read, and what the documentation says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Any text.
    Text,
    /// Any text that must not be logged.
    Secret,
    /// A file or directory path.
    Path,
    /// A TCP port, 0-65535.
    Port,
    /// A positive integer.
    Count,
    /// A positive number of milliseconds.
    Millis,
    /// A number of milliseconds, 0 or more.
    MillisOrZero,
    /// A positive number of seconds.
    Seconds,
    /// A number of seconds, 0 or more.
    SecondsOrZero,
    /// A number of bytes, 0 or more.
    Bytes,
    /// `true` or `false`, any case.
    Bool,
    /// One of these words, any case.
    Choice(&'static [&'static str]),
    /// Comma-separated values.
    List,
    /// A URL starting with one of these prefixes.
    Url(&'static [&'static str]),
}

impl Kind {
    /// What a value must look like, as said when it does not.
    pub fn expected(self) -> String {
        match self {
            Kind::Text | Kind::Secret | Kind::Path | Kind::List => "expected text".into(),
            Kind::Port => "expected a port number (0-65535)".into(),
            Kind::Count | Kind::Millis | Kind::Seconds => "expected a positive integer".into(),
            Kind::SecondsOrZero => "expected a number of seconds (0 or more)".into(),
            Kind::MillisOrZero => "expected a number of milliseconds (0 or more)".into(),
            Kind::Bytes => "expected a number of bytes (0 or more)".into(),
            Kind::Bool => "expected true or false".into(),
            Kind::Choice(words) => format!("expected {}", or_list(words, "")),
            Kind::Url(prefixes) => format!("expected a {} URL", or_list(prefixes, "")),
        }
    }

    /// The unit written after a default in the documentation.
    fn unit(self) -> &'static str {
        match self {
            Kind::Millis | Kind::MillisOrZero => " ms",
            Kind::Seconds | Kind::SecondsOrZero => " s",
            Kind::Bytes => " bytes",
            _ => "",
        }
    }
}

/// `a, b or c`, each word wrapped in `quote`.
fn or_list(words: &[&str], quote: &str) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("{quote}{w}{quote}")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// What an unset variable means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// This value, read exactly as if it had been given.
    Value(&'static str),
    /// No value; the text says what that means (empty: nothing to say).
    Absent(&'static str),
}

impl Fallback {
    /// The default value, if there is one.
    pub fn value(self) -> Option<&'static str> {
        match self {
            Fallback::Value(v) => Some(v),
            Fallback::Absent(_) => None,
        }
    }
}

/// One row of [`VARIABLES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    /// Environment variable name (Queen's).
    pub name: &'static str,
    /// Key in the TOML file (matched in any case), or `None` for the environment only.
    pub toml: Option<&'static str>,
    /// What an unset variable means.
    pub default: Fallback,
    /// How the value is read.
    pub kind: Kind,
    /// What it means, one line.
    pub help: &'static str,
}

impl Variable {
    /// The default as documentation text (`—` when there is nothing to say).
    pub fn default_text(&self) -> String {
        match self.default {
            Fallback::Value(v) => format!("{v}{}", self.kind.unit()),
            Fallback::Absent("") => "—".into(),
            Fallback::Absent(text) => text.into(),
        }
    }
}

macro_rules! toml_key {
    (-) => {
        None
    };
    ($key:literal) => {
        Some($key)
    };
}

macro_rules! variables {
    ($($name:ident, $toml:tt, $default:expr, $kind:expr, $help:literal;)*) => {
        /// Every variable as a constant: what the parser reads through.
        pub mod var {
            use super::{Fallback::*, Kind::*, Variable};
            $(
                #[doc = $help]
                pub const $name: Variable = Variable {
                    name: stringify!($name),
                    toml: toml_key!($toml),
                    default: $default,
                    kind: $kind,
                    help: $help,
                };
            )*
        }

        /// Every setting the broker reads, in documentation order.
        pub const VARIABLES: &[Variable] = &[$(var::$name),*];
    };
}

const LOG_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];
const LOG_FORMATS: &[&str] = &["text", "json"];
const SEGMENT_FORMATS: &[&str] = &["framed", "items"];
const ALGORITHMS: &[&str] = &["HS256", "RS256", "EdDSA", "auto"];
const SUBSCRIPTION_MODES: &[&str] = &["all", "new"];

/// The default of `JWT_SKIP_PATHS`.
pub const DEFAULT_SKIP_PATHS: &str = "/health,/metrics/prometheus,/metrics,/";

// name, TOML key (- for none), default, kind, meaning.
variables! {
    HOST, "host", Value("0.0.0.0"), Text, "bind address of the HTTP listener";
    PORT, "port", Value("6632"), Port, "HTTP port (0 picks a free one)";
    NUM_WORKERS, "num_workers", Absent("number of cores"), Count, "HTTP worker threads";
    QUEEN_MAX_BODY_BYTES, "queen_max_body_bytes", Value("67108864"), Count, "larger request bodies get 413";
    QUEEN_MAX_INFLIGHT_BYTES, "queen_max_inflight_bytes", Value("268435456"), Count, "memory held by the write path before 503 + `Retry-After`: request bytes × 2 plus 512 bytes per item";
    QUEEN_MAX_READING_BYTES, "queen_max_reading_bytes", Value("268435456"), Count, "request body bytes being received at once, over all connections, before 503 + `Retry-After`";
    QUEEN_BODY_TIMEOUT_MS, "queen_body_timeout_ms", Value("30000"), Millis, "a request body not fully received in this time gets 408 and its connection is closed";
    QUEEN_CORS_ORIGINS, "queen_cors_origins", Value("*"), List, "origins a browser may call the API from (`Access-Control-Allow-Origin`); `*` is any origin. Whatever the list, a cross-origin write whose content type is not `application/json` (a form or `text/plain`, which a browser sends without asking first) is refused with 403 unless its origin is listed by name (docs/operations.md)";
    QUEEN_MAX_CONNECTIONS, "queen_max_connections", Value("10000"), Count, "open client connections at most (further ones wait in the listen backlog); capped below the open-file limit";
    QUEEN_TLS_CERT_FILE, "queen_tls_cert_file", Absent("unset: plain HTTP"), Path, "PEM file of the HTTP listener's certificate chain (its own certificate first, then the intermediates); with `QUEEN_TLS_KEY_FILE` the listener serves HTTPS only, and SIGHUP reads both files again (docs/operations.md, \"TLS\")";
    QUEEN_TLS_KEY_FILE, "queen_tls_key_file", Absent("unset: plain HTTP"), Path, "PEM file of the private key of `QUEEN_TLS_CERT_FILE` (PKCS#8, PKCS#1 or SEC1; not encrypted)";
    QUEEN_KAFKA_PORT, "queen_kafka_port", Absent("unset: no Kafka listener"), Port, "port of the Kafka listener on `HOST` (0 picks a free one): Kafka clients produce and consume the same queues and partitions (docs/kafka.md)";
    QUEEN_KAFKA_ADVERTISED_HOST, "queen_kafka_advertised_host", Absent("`HOST`, or `127.0.0.1` when that is `0.0.0.0`"), Text, "the host the Kafka listener names in its metadata and FindCoordinator answers, and that the other brokers on the database name for it: the address Kafka clients reach this broker at";
    QUEEN_KAFKA_DEFAULT_PARTITIONS, "queen_kafka_default_partitions", Value("1"), Count, "partitions of a topic created by a Kafka produce or metadata request that names it (CreateTopics sets its own count)";
    QUEEN_KAFKA_MAX_FRAME_BYTES, "queen_kafka_max_frame_bytes", Value("104857600"), Bytes, "a Kafka request larger than this closes its connection (other connections are served on)";
    QUEEN_KAFKA_COORDINATOR_LEASE_MS, "queen_kafka_coordinator_lease_ms", Value("10000"), Millis, "how long a broker's hold on a Kafka group's coordination, and its place in Kafka metadata, lasts unrenewed (it renews every third of it): when a broker dies, another takes its groups after at most this long and their members rejoin there (docs/kafka.md, \"Several brokers\"); 1000 to 600000";
    LOG_LEVEL, "log_level", Value("info"), Choice(super::LOG_LEVELS), "log level; `RUST_LOG` refines it";
    LOG_FORMAT, "log_format", Value("text"), Choice(super::LOG_FORMATS), "log lines as text, or one JSON object per line";
    QUEEN_METRICS, "queen_metrics", Value("true"), Bool, "count requests, messages and commits for `/metrics` (`false` leaves the counters and histograms at zero; gauges are still read)";
    QUEEN_HISTORY_INTERVAL_MS, "queen_history_interval_ms", Value("10000"), MillisOrZero, "the broker samples its rates, backlog per queue and group, spool bytes and commit latency this often and keeps the last 360 samples (an hour at the default) for the dashboard's charts and `GET /api/v1/system/history` (0 turns the sampler off; docs/operations.md, \"History\")";
    QUEEN_HISTORY_QUEUES, "queen_history_queues", Value("10"), Count, "(queue, consumer group) pairs with the largest backlog kept in each history sample (at most 100); reading them is one statement over the consumer rows per sample";
    QUEEN_LAG_LIVE_PAIRS, "queen_lag_live_pairs", Value("10000"), Count, "lag views (consumer groups, `/lagging`, the overview's lag, the history's backlogs) measure on request while the subscribed (group, partition) pairs are at most this many; past it they read the last background pass, which one broker at a time takes every `QUEEN_LAG_PASS_MS` (docs/operations.md, \"Lag at scale\")";
    QUEEN_LAG_PASS_MS, "queen_lag_pass_ms", Value("10000"), Millis, "least time between two background lag passes (taken only while the subscribed pairs exceed `QUEEN_LAG_LIVE_PAIRS`; a pass walks every partition in chunks of 20 000)";
    QUEEN_CONFIG, -, Absent("`config/queen.toml` when present"), Path, "the TOML file read under the environment";
    DATABASE_URL, "database_url", Absent(""), Url(&["postgres://", "postgresql://"]), "PostgreSQL URL; wins over the `PG_*` variables; may list several hosts, libpq's way (`postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write`): the broker writes to whichever accepts writes; TLS to PostgreSQL with libpq's `sslmode` and `sslrootcert` parameters (`?sslmode=verify-full&sslrootcert=/etc/queen/pg-ca.pem`; docs/operations.md, \"TLS\")";
    PG_HOST, "pg_host", Value("localhost"), Text, "PostgreSQL host; `h1,h2` lists several (the broker writes to the primary)";
    PG_PORT, "pg_port", Value("5432"), Port, "PostgreSQL port";
    PG_USER, "pg_user", Value("postgres"), Text, "PostgreSQL user";
    PG_PASSWORD, "pg_password", Value("postgres"), Secret, "PostgreSQL password";
    PG_DB, "pg_db", Value("postgres"), Text, "PostgreSQL database";
    DB_POOL_SIZE, "db_pool_size", Value("20"), Count, "connections of the shared pool (health, admin, background work)";
    QUEEN_ADMIN_POOL_SIZE, "queen_admin_pool_size", Value("2"), Count, "connections of the admin-read pool (`/api/v1/resources/*`, `/api/v1/messages`, `/api/v1/dlq`, consumer-group reads): heavy reads wait here, never in the shared pool";
    QUEEN_ADMIN_STATEMENT_TIMEOUT_MS, "queen_admin_statement_timeout_ms", Value("5000"), Millis, "statement timeout of the admin-read pool (a longer read gets 503)";
    DB_STATEMENT_TIMEOUT, "db_statement_timeout", Value("30000"), Millis, "statement timeout of every session";
    DB_LOCK_TIMEOUT, "db_lock_timeout", Value("10000"), Millis, "lock timeout of every session";
    DB_CONNECTION_TIMEOUT, "db_connection_timeout", Value("2000"), Millis, "connect timeout";
    QUEEN_PRIMARY_CHECK_MS, "queen_primary_check_ms", Value("1000"), Millis, "with several database hosts: how often the broker checks that its host still accepts writes (a failed commit checks at once) and that no other host accepts writes on a newer timeline (a promotion without fencing)";
    QUEEN_PRIVATE_PG_DIR, "queen_private_pg_dir", Value(".queen/postgres"), Path, "data folder of the private PostgreSQL";
    QUEEN_PRIVATE_PG_PROBE, "queen_private_pg_probe", Value("127.0.0.1:5432"), Text, "where a local PostgreSQL is looked for before a private one is started";
    QUEEN_COMMITTERS, "queen_committers", Value("2"), Count, "committer actors, each with its own connection";
    QUEEN_COMMITTER_SPILL_ITEMS, "queen_committer_spill_items", Value("256"), Count, "items one committer holds before the next starts a parallel transaction";
    QUEEN_CONSUMER_LAG_MS, "queen_consumer_lag_ms", Value("100"), MillisOrZero, "when a pop hands out a message that waited this long (its consumers are behind), pushes commit one transaction at a time for the next 250 ms instead of spilling into parallel ones, pausing after each the longer the further behind (1 ms per 4 ms beyond this, at most 30 ms), leaving CPU to the consumers (0 turns this off)";
    QUEEN_COMMIT_TIMEOUT_MS, "queen_commit_timeout_ms", Value("10000"), Millis, "a commit taking longer counts as PostgreSQL unreachable (its items are spooled)";
    QUEEN_SEGMENT_CACHE_BYTES, "queen_segment_cache_bytes", Value("8388608"), Bytes, "committed segments kept in memory for pops and acks, of queues popped on this broker within the last minute (0 turns the cache off); the budget it starts with and shrinks back to";
    QUEEN_SEGMENT_CACHE_MAX_BYTES, "queen_segment_cache_max_bytes", Value("67108864"), Bytes, "the segment cache's budget grows up to this while pops read again segments it evicted lately (consumer groups behind one another), and halves back towards `QUEEN_SEGMENT_CACHE_BYTES` after a minute without (at or below that: fixed budget); never past 1/16 of the memory the broker may use (cgroup limit, else RAM)";
    QUEEN_SEGMENT_FORMAT, "queen_segment_format", Value("framed"), Choice(super::SEGMENT_FORMATS), "layout of the segments this broker writes: `framed` (record frames of the 2.x binary wire, which framed pops send as stored) or `items` (the only layout brokers before it read): set `items` while such brokers share the database (docs/binary-wire.md, \"Stored frames\")";
    QUEEN_POP_FRAMES_COMPRESS_FROM, "queen_pop_frames_compress_from", Value("0"), Bytes, "a framed pop (`frames=true`) compresses its records with zstd when its payloads come to at least this many bytes (0: never; the records then go as stored; compressing costs about 1 µs of broker CPU per message for a third fewer bytes on the wire)";
    QUEEN_EPHEMERAL_MAX_BYTES, "queen_ephemeral_max_bytes", Value("268435456"), Bytes, "memory all ephemeral queues of this broker may hold (payloads plus 128 bytes per message); a push past it gets 503 + `Retry-After` (0 refuses every ephemeral push)";
    QUEEN_PARTITION_MAX_PENDING, "queen_partition_max_pending", Value("100000"), Count, "items waiting in one partition before 503";
    QUEEN_PARTITION_IDLE_MS, "queen_partition_idle_ms", Value("30000"), Millis, "an idle partition actor stops after this";
    QUEEN_PARTITION_ACTORS_MAX, "queen_partition_actors_max", Value("10000"), Count, "live partition actors at most: beyond it the least recently used idle ones stop (bounds memory however many partitions are written; docs/operations.md)";
    FILE_BUFFER_DIR, "file_buffer_dir", Value("/var/lib/queen/buffers"), Path, "spool directory";
    QUEEN_REPLAY_TICK_MS, "queen_replay_tick_ms", Value("250"), Millis, "how often the spool replayer looks for work";
    QUEEN_REPLAY_BACKOFF_MS, "queen_replay_backoff_ms", Value("100"), Millis, "replay back-off base: after n failed rounds it waits base × 2^min(n, 4)";
    QUEEN_SPOOL_REPORT_MS, "queen_spool_report_ms", Value("10000"), Millis, "interval of the `spool status` log line (logged while there is something to say)";
    QUEEN_FLAG_POLL_MS, "queen_flag_poll_ms", Value("1000"), Millis, "how often the maintenance flags are read from PostgreSQL";
    QUEEN_FLAG_READ_TIMEOUT_MS, "queen_flag_read_timeout_ms", Value("2000"), Millis, "longest one read of the flags may take (the last known flags stay)";
    QUEEN_POP_RECHECK_MS, "queen_pop_recheck_ms", Value("1000"), Millis, "a waiting pop re-reads PostgreSQL at least this often (lease expiry, delayed messages)";
    QUEEN_POP_AHEAD_MS, "queen_pop_ahead_ms", Value("50"), MillisOrZero, "an ack that ends a lease claims the group's next partition for the consumer's next pop while its commit flushes; a lease no pop takes within this is released (0 turns this off)";
    QUEEN_HEALTH_TIMEOUT_MS, "queen_health_timeout_ms", Value("2000"), Millis, "`GET /health` answers 503 when `SELECT 1` takes longer";
    QUEEN_DEDUP_SWEEP_MS, "queen_dedup_sweep_ms", Value("60000"), Millis, "interval of the expired dedup-key sweep";
    RETENTION_INTERVAL, "retention_interval", Value("300000"), Millis, "interval of the retention sweep (docs/operations.md)";
    RETENTION_BATCH_SIZE, "retention_batch_size", Value("1000"), Count, "segments one retention statement removes at most";
    // Pop defaults and payload encryption (Queen's names).
    DEFAULT_BATCH_SIZE, "default_batch_size", Value("1"), Count, "pop `batch` when the request leaves it out";
    DEFAULT_TIMEOUT, "default_timeout", Value("30000"), Millis, "pop `timeout` when the request leaves it out";
    DEFAULT_SUBSCRIPTION_MODE, "default_subscription_mode", Value("all"), Choice(super::SUBSCRIPTION_MODES), "where a named group's first pop starts (history, or from now) when the pop names no `subscriptionMode` or `subscriptionFrom`";
    QUEEN_ENCRYPTION_KEY, "queen_encryption_key", Absent("unset: `encryptionEnabled` is refused"), Secret, "AES-256 key of `encryptionEnabled` queues, 64 hex characters (docs/operations.md)";
    JWT_ENABLED, "jwt_enabled", Value("false"), Bool, "require a bearer JWT on every route but the skip paths";
    JWT_ALGORITHM, "jwt_algorithm", Value("HS256"), Choice(super::ALGORITHMS), "which signatures are accepted (any case); `auto` goes by each token's header";
    JWT_SECRET, "jwt_secret", Absent(""), Secret, "HS256 shared secret";
    JWT_PUBLIC_KEY, "jwt_public_key", Absent(""), Text, "RSA or Ed25519 public key, PEM; wins over `JWT_JWKS_URL`";
    JWT_JWKS_URL, "jwt_jwks_url", Absent(""), Url(&["http://", "https://"]), "URL of a JWKS, whose RSA or Ed25519 keys are chosen by the token's `kid`";
    JWT_JWKS_REFRESH_INTERVAL, "jwt_jwks_refresh_interval", Value("3600"), Seconds, "a fetched key set is used this long before it is fetched again";
    JWT_JWKS_TIMEOUT_MS, "jwt_jwks_timeout_ms", Value("5000"), Millis, "key set fetch timeout";
    JWT_ISSUER, "jwt_issuer", Absent("not checked"), Text, "when set, `iss` must be present and equal";
    JWT_AUDIENCE, "jwt_audience", Absent("not checked"), Text, "when set, `aud` must be present and contain it";
    JWT_CLOCK_SKEW, "jwt_clock_skew", Value("30"), SecondsOrZero, "leeway for `exp`, `nbf` and `iat`";
    JWT_SKIP_PATHS, "jwt_skip_paths", Value(super::DEFAULT_SKIP_PATHS), List, "paths served without a token";
    JWT_ROLES_CLAIM, "jwt_roles_claim", Value("role"), Text, "string claim holding one role";
    JWT_ROLES_ARRAY_CLAIM, "jwt_roles_array_claim", Value("roles"), Text, "string-array claim holding several roles";
    JWT_ROLE_ADMIN, "jwt_role_admin", Value("admin"), Text, "role value of operators";
    JWT_ROLE_READ_WRITE, "jwt_role_read_write", Value("read-write"), Text, "role value of producers and consumers";
    JWT_ROLE_READ_ONLY, "jwt_role_read_only", Value("read-only"), Text, "role value of dashboards and viewers";
    JWT_ROLE_WRITE_ONLY, "jwt_role_write_only", Value("write-only"), Text, "role value that may only push (ours; Queen has no such role)";
}

/// [`VARIABLES`] as a Markdown table (the README's configuration table).
pub fn markdown_table() -> String {
    markdown_table_of(|_| true)
}

/// The rows of [`VARIABLES`] that `keep` keeps, as a Markdown table.
pub fn markdown_table_of(keep: impl Fn(&Variable) -> bool) -> String {
    let mut out = String::from("| Variable | Default | Meaning |\n| --- | --- | --- |\n");
    for v in VARIABLES.iter().filter(|v| keep(v)) {
        let default = match v.default {
            Fallback::Value(value) => format!("`{value}`{}", v.kind.unit()),
            Fallback::Absent(_) => v.default_text(),
        };
        let mut meaning = v.help.to_string();
        match v.kind {
            Kind::Choice(words) | Kind::Url(words) => {
                meaning += &format!(" ({})", or_list(words, "`"));
            }
            Kind::Bool => meaning += " (`true` or `false`)",
            Kind::List => meaning += " (comma-separated)",
            Kind::Secret => meaning += "; secret, never logged",
            _ => {}
        }
        if v.toml.is_none() {
            meaning += "; environment only";
        }
        out += &format!("| `{}` | {default} | {meaning} |\n", v.name);
    }
    out
}

/// Example values for the settings that have no default, shown in the example file.
const EXAMPLES: &[(&str, &str)] = &[
    ("NUM_WORKERS", "4"),
    ("QUEEN_TLS_CERT_FILE", "/etc/queen/tls/cert.pem"),
    ("QUEEN_TLS_KEY_FILE", "/etc/queen/tls/key.pem"),
    (
        "DATABASE_URL",
        "postgres://queen:secret@db.example.com:5432/queen?sslmode=verify-full&sslrootcert=/etc/queen/pg-ca.pem",
    ),
    (
        "QUEEN_ENCRYPTION_KEY",
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    ),
    ("JWT_SECRET", "change-me"),
    (
        "JWT_PUBLIC_KEY",
        "-----BEGIN PUBLIC KEY-----\n...\n-----END PUBLIC KEY-----",
    ),
    ("JWT_JWKS_URL", "https://auth.example.com/.well-known/jwks.json"),
    ("JWT_ISSUER", "https://auth.example.com/"),
    ("JWT_AUDIENCE", "queen"),
];

/// A value as TOML: numbers and booleans bare, everything else a basic string.
fn toml_value(kind: Kind, value: &str) -> String {
    let bare = match kind {
        Kind::Port
        | Kind::Count
        | Kind::Millis
        | Kind::MillisOrZero
        | Kind::Seconds
        | Kind::SecondsOrZero
        | Kind::Bytes => value.parse::<u64>().is_ok(),
        Kind::Bool => matches!(value, "true" | "false"),
        _ => false,
    };
    if bare {
        return value.to_string();
    }
    let mut out = String::from('"');
    for c in value.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            '\n' => out += "\\n",
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` as `# ` comment lines of at most `width` characters (a longer word stays whole).
fn comment_lines(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > width {
            out += &line;
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line += word;
    }
    out += &line;
    out.push('\n');
    out
}

/// `config/queen.example.toml`, generated from [`VARIABLES`]: every setting the file can hold,
/// each with its meaning and default, commented out (a test keeps the file current; with
/// `QUEEN_BLESS=1` that test writes it).
pub fn example_toml() -> String {
    let mut out = String::from(
        "# Example configuration of queen-broker, generated from the settings table in\n\
         # src/settings.rs (do not edit by hand: `QUEEN_BLESS=1 cargo test --lib example_configuration`\n\
         # writes it again). Copy it to config/queen.toml (read when present) or point QUEEN_CONFIG at\n\
         # it. Keys are the environment variables' names in any case; the environment and the\n\
         # command line win over the file. Every line is commented out: the value shown is the\n\
         # default, or an example where there is none.\n",
    );
    for v in VARIABLES {
        let Some(key) = v.toml else { continue };
        let mut meaning = format!("{}: {}", v.name, v.help.replace('`', ""));
        match v.kind {
            Kind::Choice(words) | Kind::Url(words) => {
                meaning += &format!(" ({})", or_list(words, ""));
            }
            Kind::Bool => meaning += " (true or false)",
            Kind::List => meaning += " (comma-separated)",
            Kind::Secret => meaning += "; secret, never logged",
            _ => {}
        }
        let (value, note) = match v.default {
            Fallback::Value(value) => (Some(value), format!("Default: {}", v.default_text())),
            Fallback::Absent(_) => (
                EXAMPLES.iter().find(|(n, _)| *n == v.name).map(|(_, e)| *e),
                format!(
                    "Default: {}",
                    match v.default_text().as_str() {
                        "—" => "unset".to_string(),
                        text => text.replace('`', ""),
                    }
                ),
            ),
        };
        out.push('\n');
        out += &comment_lines(&format!("{meaning}. {note}."), 98);
        match value {
            Some(value) => out += &format!("# {key} = {}\n", toml_value(v.kind, value)),
            None => out += &format!("# {key} = \"\"\n"),
        }
    }
    out
}

/// The command-line flag of a variable, without the dashes: `port` for `PORT`, `config` for
/// `QUEEN_CONFIG`.
pub fn flag_of(v: &Variable) -> String {
    if v.name == var::QUEEN_CONFIG.name {
        "config".into()
    } else {
        v.name.to_ascii_lowercase().replace('_', "-")
    }
}

/// What `--help` shows as a flag's value.
fn value_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Text | Kind::List => "TEXT",
        Kind::Secret => "SECRET",
        Kind::Path => "PATH",
        Kind::Port => "PORT",
        Kind::Count => "N",
        Kind::Millis | Kind::MillisOrZero => "MS",
        Kind::Seconds | Kind::SecondsOrZero => "SECONDS",
        Kind::Bytes => "BYTES",
        Kind::Bool => "true|false",
        Kind::Choice(_) => "WORD",
        Kind::Url(_) => "URL",
    }
}

/// The command line, generated from [`VARIABLES`]: one `--flag VALUE` per variable (with the
/// variable's name, default and meaning as its help), plus `--help` and `--version`.
pub fn command() -> clap::Command {
    let mut cmd = clap::Command::new("queen-broker")
        .version(env!("CARGO_PKG_VERSION"))
        .about(env!("CARGO_PKG_DESCRIPTION"))
        .after_help(
            "Every setting is read from its flag, else its environment variable, else the \
             config file (--config, TOML, keys are the variables' names in any case), else its \
             default. docs/operations.md describes them.",
        );
    for v in VARIABLES {
        let mut help = v.help.replace('`', "");
        match v.kind {
            Kind::Choice(words) | Kind::Url(words) => help += &format!(" ({})", or_list(words, "")),
            Kind::List => help += " (comma-separated)",
            _ => {}
        }
        help += &format!(
            " [env: {}] [default: {}]",
            v.name,
            v.default_text().replace('`', "")
        );
        cmd = cmd.arg(
            clap::Arg::new(v.name)
                .long(flag_of(v))
                .value_name(value_name(v.kind))
                .help(help)
                .num_args(1)
                .action(clap::ArgAction::Set),
        );
    }
    cmd
}

/// Why the command line could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CommandLineError {
    /// An unknown flag, a missing value, or `--help`/`--version` (which clap answers itself:
    /// [`clap::Error::exit`] prints and exits 0 for those, 2 otherwise).
    #[error("{0}")]
    Args(#[from] clap::Error),
    /// A value that does not parse.
    #[error("{0}")]
    Settings(#[from] SettingsError),
}

impl Settings {
    /// Reads the command line over `env` (a flag wins over its variable): `args` includes the
    /// program name, as `std::env::args_os()` gives it.
    ///
    /// # Errors
    ///
    /// [`CommandLineError::Args`] for an unknown flag, a missing value, `--help` or
    /// `--version`; [`CommandLineError::Settings`] naming the flag and its variable when a
    /// value is unusable.
    pub fn from_command_line<I, T>(
        args: I,
        mut env: HashMap<String, String>,
    ) -> Result<Self, CommandLineError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = command().try_get_matches_from(args)?;
        let mut given = Vec::new();
        for v in VARIABLES {
            if let Some(value) = matches.get_one::<String>(v.name) {
                env.insert(v.name.to_string(), value.clone());
                given.push(v);
            }
        }
        Self::from_map(env).map_err(|e| {
            match e {
                SettingsError::Invalid {
                    name,
                    value,
                    reason,
                } => match given.iter().find(|v| v.name == name) {
                    Some(v) => SettingsError::Invalid {
                        name: format!("--{} ({name})", flag_of(v)),
                        value,
                        reason,
                    },
                    None => SettingsError::Invalid {
                        name,
                        value,
                        reason,
                    },
                },
                other => other,
            }
            .into()
        })
    }
}

/// Where PostgreSQL is, as configured.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// A full URL (`DATABASE_URL`).
    Url(String),
    /// Queen's `PG_*` variables.
    Parts {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
        /// User name.
        user: String,
        /// Password.
        password: String,
        /// Database name.
        database: String,
    },
}

impl Database {
    /// The connection URL.
    pub fn url(&self) -> String {
        match self {
            Database::Url(url) => url.clone(),
            Database::Parts {
                host,
                port,
                user,
                password,
                database,
            } => {
                // `PG_HOST=h1,h2`: every host without a port of its own gets `PG_PORT` (libpq's
                // URL form would give it 5432).
                let hosts: Vec<String> = host
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(|h| {
                        let has_port = match h.rfind(']') {
                            Some(end) => h[end..].contains(':'),
                            None => h.contains(':'),
                        };
                        if has_port {
                            h.to_string()
                        } else {
                            format!("{h}:{port}")
                        }
                    })
                    .collect();
                let hosts = hosts.join(",");
                format!("postgres://{user}:{password}@{hosts}/{database}")
            }
        }
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Url(url) => write!(f, "Url({})", redact_url(url)),
            Database::Parts {
                host,
                port,
                user,
                database,
                ..
            } => {
                write!(f, "postgres://{user}:***@{host}:{port}/{database}")
            }
        }
    }
}

fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_string(),
    }
}

/// The broker's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Bind address.
    pub host: String,
    /// HTTP port.
    pub port: u16,
    /// The database.
    pub database: Database,
    /// Whether the database was configured at all (else a private cluster may be started).
    pub database_configured: bool,
    /// Shared pool size.
    pub db_pool_size: u32,
    /// Statement timeout.
    pub statement_timeout: Duration,
    /// With several database hosts: how often the current host is checked for writes.
    pub primary_check_every: Duration,
    /// Lock timeout.
    pub lock_timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Number of committers.
    pub committers: usize,
    /// Items one committer holds before the next one is used.
    pub committer_spill_items: usize,
    /// A popped message that waited this long makes pushes commit one transaction at a time
    /// for a while (zero: never).
    pub consumer_lag: Duration,
    /// Longest a commit may take before its items are spooled.
    pub commit_timeout: Duration,
    /// Bytes of committed segments kept in memory for pops and acks (0: none).
    pub segment_cache_bytes: usize,
    /// The most the segment cache's budget grows to.
    pub segment_cache_max_bytes: usize,
    /// Segments are written as version 1 (`QUEEN_SEGMENT_FORMAT=items`), not the framed layout.
    pub segment_items: bool,
    /// Payload bytes from which a framed pop compresses its records (0: never).
    pub pop_frames_compress_from: usize,
    /// Memory all ephemeral queues may hold.
    pub ephemeral_max_bytes: usize,
    /// Memory (request bytes × 2 + 512 per item) in the write path before 503.
    pub max_inflight_bytes: usize,
    /// Body bytes being received at once before 503.
    pub max_reading_bytes: usize,
    /// Longest a request body may take to arrive.
    pub body_timeout: Duration,
    /// Open client connections at most.
    pub max_connections: usize,
    /// Connections of the admin-read pool.
    pub admin_pool_size: u32,
    /// Statement timeout of the admin-read pool.
    pub admin_statement_timeout: Duration,
    /// Items waiting per partition before 503.
    pub partition_max_pending: usize,
    /// Idle time after which a partition actor stops.
    pub partition_idle: Duration,
    /// Live partition actors at most (least recently used idle ones are evicted beyond it).
    pub partition_actors_max: usize,
    /// Dedup sweep interval.
    pub dedup_sweep_every: Duration,
    /// Retention sweep interval.
    pub retention_every: Duration,
    /// Segments one retention statement removes at most.
    pub retention_batch: i64,
    /// How often the spool replayer looks for work.
    pub replay_every: Duration,
    /// Base of the replay back-off after a failed round.
    pub replay_backoff: Duration,
    /// Interval of the spool status log line.
    pub spool_report_every: Duration,
    /// How often the maintenance flags are read from PostgreSQL.
    pub flag_poll_every: Duration,
    /// Longest one read of the flags may take.
    pub flag_read_timeout: Duration,
    /// A waiting pop re-reads PostgreSQL at least this often.
    pub pop_recheck: Duration,
    /// How long a lease claimed ahead of a consumer's next pop waits for it (zero: never
    /// claimed ahead).
    pub pop_ahead: Duration,
    /// Longest the readiness check's `SELECT 1` may take.
    pub health_timeout: Duration,
    /// Data folder of the private PostgreSQL.
    pub private_pg_dir: PathBuf,
    /// Where a local PostgreSQL is looked for before a private one is started.
    pub private_pg_probe: String,
    /// Spool directory.
    pub file_buffer_dir: PathBuf,
    /// HTTP workers.
    pub workers: usize,
    /// Log level.
    pub log_level: String,
    /// `true`: one JSON object per log line.
    pub log_json: bool,
    /// Whether counters and histograms are recorded.
    pub metrics: bool,
    /// How often the history sampler runs (`QUEEN_HISTORY_INTERVAL_MS`; zero: off).
    pub history_interval: Duration,
    /// (queue, group) pairs per history sample (`QUEEN_HISTORY_QUEUES`, at most 100).
    pub history_queues: usize,
    /// Subscribed (group, partition) pairs up to which lag is measured on request
    /// (`QUEEN_LAG_LIVE_PAIRS`).
    pub lag_live_pairs: i64,
    /// Least time between two background lag passes (`QUEEN_LAG_PASS_MS`).
    pub lag_pass_interval: Duration,
    /// `QUEEN_CORS_ORIGINS`: origins allowed to call from a browser (`*`: any).
    pub cors_origins: Vec<String>,
    /// `QUEEN_TLS_CERT_FILE` and `QUEEN_TLS_KEY_FILE`: the listener serves HTTPS with them
    /// (`None`: plain HTTP).
    pub tls: Option<TlsFiles>,
    /// Authentication (`JWT_*`).
    pub jwt: JwtSettings,
    /// Pop `batch` when the request leaves it out (`DEFAULT_BATCH_SIZE`).
    pub default_batch: usize,
    /// Pop `timeout` when the request leaves it out (`DEFAULT_TIMEOUT`).
    pub default_timeout: Duration,
    /// A named group's first pop starts at the end of history (`DEFAULT_SUBSCRIPTION_MODE=new`).
    pub default_subscription_new: bool,
    /// `QUEEN_ENCRYPTION_KEY`, decoded.
    pub encryption_key: Option<EncryptionKey>,
    /// The Kafka listener, when `QUEEN_KAFKA_PORT` is set.
    pub kafka: Option<KafkaSettings>,
}

/// The Kafka listener's settings (docs/kafka.md).
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// Port on `HOST` (0: a free one).
    pub port: u16,
    /// The host named in metadata answers.
    pub advertised_host: String,
    /// Partitions of an auto-created topic.
    pub default_partitions: i32,
    /// Largest request frame.
    pub max_frame_bytes: usize,
    /// How long a hold on a group's coordination (and a broker's registration) lasts unrenewed.
    pub coordinator_lease: Duration,
}

/// The certificate chain and private key of the HTTP listener (`crate::tls` reads them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// `QUEEN_TLS_CERT_FILE`: PEM certificate chain, the listener's own certificate first.
    pub cert_file: PathBuf,
    /// `QUEEN_TLS_KEY_FILE`: PEM private key of that certificate.
    pub key_file: PathBuf,
}

/// The 32 bytes of `QUEEN_ENCRYPTION_KEY`; `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey(pub [u8; 32]);

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncryptionKey(***)")
    }
}

impl EncryptionKey {
    /// Reads 64 hexadecimal characters (any case, surrounding blanks ignored).
    ///
    /// # Errors
    ///
    /// What is wrong with the text (its length, or a character that is not hexadecimal); the
    /// text itself is never part of the message.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(format!(
                "expected 64 hexadecimal characters (32 bytes), got {} characters",
                text.chars().count()
            ));
        }
        let mut key = [0u8; 32];
        hex::decode_to_slice(text, &mut key)
            .map_err(|_| "expected 64 hexadecimal characters (0-9, a-f)".to_string())?;
        Ok(Self(key))
    }
}

/// Which signatures `JWT_ALGORITHM` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JwtAlgorithm {
    /// HMAC-SHA256 with `JWT_SECRET`.
    Hs256,
    /// RSA (RS256, also RS384/RS512 headers) with a PEM key or a JWKS.
    Rs256,
    /// Ed25519 with a PEM key or a JWKS.
    EdDsa,
    /// Chosen per token from its header: whatever key material is configured.
    Auto,
}

impl JwtAlgorithm {
    /// The name as written in `JWT_ALGORITHM`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hs256 => "HS256",
            Self::Rs256 => "RS256",
            Self::EdDsa => "EdDSA",
            Self::Auto => "auto",
        }
    }
}

/// The role values of `JWT_ROLE_*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleNames {
    /// `JWT_ROLE_ADMIN`.
    pub admin: String,
    /// `JWT_ROLE_READ_WRITE`.
    pub read_write: String,
    /// `JWT_ROLE_READ_ONLY`.
    pub read_only: String,
    /// `JWT_ROLE_WRITE_ONLY`.
    pub write_only: String,
}

/// Authentication settings (reference §10, §11). Key material is only checked for presence
/// here; `auth::Gatekeeper::new` parses it.
#[derive(Clone)]
pub struct JwtSettings {
    /// `JWT_ENABLED`.
    pub enabled: bool,
    /// `JWT_ALGORITHM`.
    pub algorithm: JwtAlgorithm,
    /// `JWT_SECRET`.
    pub secret: Option<String>,
    /// `JWT_PUBLIC_KEY` (PEM text).
    pub public_key: Option<String>,
    /// `JWT_JWKS_URL`.
    pub jwks_url: Option<String>,
    /// `JWT_JWKS_REFRESH_INTERVAL`.
    pub jwks_refresh: Duration,
    /// `JWT_JWKS_TIMEOUT_MS`.
    pub jwks_timeout: Duration,
    /// `JWT_ISSUER`.
    pub issuer: Option<String>,
    /// `JWT_AUDIENCE`.
    pub audience: Option<String>,
    /// `JWT_CLOCK_SKEW`, in seconds.
    pub clock_skew_secs: u64,
    /// `JWT_SKIP_PATHS`.
    pub skip_paths: Vec<String>,
    /// `JWT_ROLES_CLAIM`.
    pub roles_claim: String,
    /// `JWT_ROLES_ARRAY_CLAIM`.
    pub roles_array_claim: String,
    /// `JWT_ROLE_*`.
    pub role_names: RoleNames,
}

impl fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtSettings")
            .field("enabled", &self.enabled)
            .field("algorithm", &self.algorithm)
            // Neither the value nor the word: logs are grepped for leaked secrets.
            .field("hs256_key", &self.secret.as_ref().map(|_| "***"))
            .field("public_key", &self.public_key.as_ref().map(|_| "<pem>"))
            .field("jwks_url", &self.jwks_url)
            .field("jwks_refresh", &self.jwks_refresh)
            .field("jwks_timeout", &self.jwks_timeout)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("clock_skew_secs", &self.clock_skew_secs)
            .field("skip_paths", &self.skip_paths)
            .field("roles_claim", &self.roles_claim)
            .field("roles_array_claim", &self.roles_array_claim)
            .field("role_names", &self.role_names)
            .finish()
    }
}

/// A setting that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value that does not parse.
    #[error("invalid value {value:?} for {name}: {reason}")]
    Invalid {
        /// Variable name.
        name: String,
        /// The value given.
        value: String,
        /// What was expected.
        reason: String,
    },
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    File {
        /// File path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

fn invalid(v: &Variable, value: &str, reason: &str) -> SettingsError {
    SettingsError::Invalid {
        name: v.name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// The values given: the environment over the config file. Every read goes through a
/// [`Variable`], which supplies the name, the TOML key, the default and the way to parse.
struct Source {
    env: HashMap<String, String>,
    /// The file's values by lower-case key.
    file: HashMap<String, String>,
    /// Names read so far (a test checks that the parser reads every row of the table).
    read: std::cell::RefCell<Vec<&'static str>>,
}

impl Source {
    /// The value given (the environment wins, even when empty), or `None` when unset or empty.
    fn given(&self, v: &Variable) -> Option<&str> {
        self.read.borrow_mut().push(v.name);
        let from_file = || v.toml.and_then(|key| self.file.get(key));
        self.env
            .get(v.name)
            .or_else(from_file)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }

    /// The value given, else the table's default value.
    fn raw(&self, v: &Variable) -> Option<&str> {
        self.given(v).or(v.default.value())
    }

    /// The value, which the table must give a default for when it is required.
    fn required(&self, v: &Variable) -> Result<&str, SettingsError> {
        self.raw(v)
            .ok_or_else(|| invalid(v, "", "no value given and no default"))
    }

    /// Text as given (not trimmed): `Text`, `Secret` and `Path` variables.
    fn text(&self, v: &Variable) -> Option<String> {
        debug_assert!(matches!(v.kind, Kind::Text | Kind::Secret | Kind::Path));
        self.raw(v).map(str::to_string)
    }

    /// Text, trimmed, that has a default.
    fn word(&self, v: &Variable) -> Result<String, SettingsError> {
        debug_assert_eq!(v.kind, Kind::Text);
        Ok(self.required(v)?.trim().to_string())
    }

    fn number<T: std::str::FromStr>(&self, v: &Variable, raw: &str) -> Result<T, SettingsError> {
        raw.trim()
            .parse()
            .map_err(|_| invalid(v, raw, &v.kind.expected()))
    }

    fn port(&self, v: &Variable) -> Result<u16, SettingsError> {
        debug_assert_eq!(v.kind, Kind::Port);
        self.number(v, self.required(v)?)
    }

    /// A `Count`, `None` when unset without a default.
    fn opt_count(&self, v: &Variable) -> Result<Option<u64>, SettingsError> {
        debug_assert_eq!(v.kind, Kind::Count);
        let Some(raw) = self.raw(v) else {
            return Ok(None);
        };
        match self.number(v, raw)? {
            0 => Err(invalid(v, raw, &v.kind.expected())),
            n => Ok(Some(n)),
        }
    }

    fn count(&self, v: &Variable) -> Result<u64, SettingsError> {
        self.opt_count(v)?
            .ok_or_else(|| invalid(v, "", "no value given and no default"))
    }

    /// A `Bytes` variable.
    fn bytes(&self, v: &Variable) -> Result<u64, SettingsError> {
        debug_assert_eq!(v.kind, Kind::Bytes);
        let raw = self.required(v)?;
        self.number(v, raw)
    }

    fn duration(&self, v: &Variable) -> Result<Duration, SettingsError> {
        let raw = self.required(v)?;
        let n: u64 = self.number(v, raw)?;
        match v.kind {
            Kind::Millis | Kind::Seconds if n == 0 => Err(invalid(v, raw, &v.kind.expected())),
            Kind::Millis | Kind::MillisOrZero => Ok(Duration::from_millis(n)),
            Kind::Seconds | Kind::SecondsOrZero => Ok(Duration::from_secs(n)),
            _ => Err(invalid(v, raw, "not a duration setting")),
        }
    }

    fn flag(&self, v: &Variable) -> Result<bool, SettingsError> {
        debug_assert_eq!(v.kind, Kind::Bool);
        let raw = self.required(v)?;
        match raw.trim() {
            t if t.eq_ignore_ascii_case("true") => Ok(true),
            t if t.eq_ignore_ascii_case("false") => Ok(false),
            _ => Err(invalid(v, raw.trim(), &v.kind.expected())),
        }
    }

    /// The table's spelling of the word given (compared in any case).
    fn choice(&self, v: &Variable) -> Result<&'static str, SettingsError> {
        let raw = self.required(v)?;
        let Kind::Choice(words) = v.kind else {
            return Err(invalid(v, raw, "not a choice setting"));
        };
        words
            .iter()
            .find(|w| w.eq_ignore_ascii_case(raw.trim()))
            .copied()
            .ok_or_else(|| invalid(v, raw.trim(), &v.kind.expected()))
    }

    fn list(&self, v: &Variable) -> Vec<String> {
        debug_assert_eq!(v.kind, Kind::List);
        self.raw(v)
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// A URL, trimmed; the error shows it with its password redacted.
    fn url(&self, v: &Variable) -> Result<Option<String>, SettingsError> {
        let Some(raw) = self.raw(v) else {
            return Ok(None);
        };
        let url = raw.trim();
        match v.kind {
            Kind::Url(prefixes) if prefixes.iter().any(|p| url.starts_with(p)) => {
                Ok(Some(url.to_string()))
            }
            _ => Err(invalid(v, &redact_url(url), &v.kind.expected())),
        }
    }
}

impl Source {
    /// The environment over the file it names (`QUEEN_CONFIG`, else `config/queen.toml` when
    /// present).
    fn new(env: HashMap<String, String>) -> Result<Self, SettingsError> {
        let mut src = Source {
            env,
            file: HashMap::new(),
            read: Default::default(),
        };
        let path = match src.given(&var::QUEEN_CONFIG) {
            Some(path) => Some(PathBuf::from(path)),
            None => Some(PathBuf::from("config/queen.toml")).filter(|p| p.exists()),
        };
        if let Some(path) = path {
            src.file = read_toml(&path)?;
        }
        Ok(src)
    }
}

impl Settings {
    /// Reads the process environment and the optional config file.
    ///
    /// # Errors
    ///
    /// [`SettingsError`] naming the variable whose value is unusable.
    pub fn from_env() -> Result<Self, SettingsError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Self::from_map(env)
    }

    /// Builds settings from explicit variables (the environment, in production), over the TOML
    /// file they name (or `config/queen.toml` when present).
    ///
    /// # Errors
    ///
    /// [`SettingsError`] naming the variable whose value is unusable.
    pub fn from_map(env: HashMap<String, String>) -> Result<Self, SettingsError> {
        Self::from_source(&Source::new(env)?)
    }

    fn from_source(src: &Source) -> Result<Self, SettingsError> {
        use var::*;
        let pg = [&PG_HOST, &PG_PORT, &PG_USER, &PG_PASSWORD, &PG_DB];
        let database_url = src.url(&DATABASE_URL)?;
        let database_configured =
            database_url.is_some() || pg.iter().any(|v| src.given(v).is_some());
        let database = match database_url {
            Some(url) => Database::Url(url),
            None => Database::Parts {
                host: src.required(&PG_HOST)?.to_string(),
                port: src.port(&PG_PORT)?,
                user: src.required(&PG_USER)?.to_string(),
                password: src.required(&PG_PASSWORD)?.to_string(),
                database: src.required(&PG_DB)?.to_string(),
            },
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Self {
            host: src.required(&HOST)?.to_string(),
            port: src.port(&PORT)?,
            database,
            database_configured,
            db_pool_size: src.count(&DB_POOL_SIZE)? as u32,
            statement_timeout: src.duration(&DB_STATEMENT_TIMEOUT)?,
            lock_timeout: src.duration(&DB_LOCK_TIMEOUT)?,
            connect_timeout: src.duration(&DB_CONNECTION_TIMEOUT)?,
            primary_check_every: src.duration(&QUEEN_PRIMARY_CHECK_MS)?,
            max_body_bytes: src.count(&QUEEN_MAX_BODY_BYTES)? as usize,
            committers: src.count(&QUEEN_COMMITTERS)? as usize,
            committer_spill_items: src.count(&QUEEN_COMMITTER_SPILL_ITEMS)? as usize,
            consumer_lag: src.duration(&QUEEN_CONSUMER_LAG_MS)?,
            commit_timeout: src.duration(&QUEEN_COMMIT_TIMEOUT_MS)?,
            segment_cache_bytes: src.bytes(&QUEEN_SEGMENT_CACHE_BYTES)? as usize,
            segment_cache_max_bytes: src.bytes(&QUEEN_SEGMENT_CACHE_MAX_BYTES)? as usize,
            segment_items: src.choice(&QUEEN_SEGMENT_FORMAT)? == "items",
            pop_frames_compress_from: src.bytes(&QUEEN_POP_FRAMES_COMPRESS_FROM)? as usize,
            ephemeral_max_bytes: src.bytes(&QUEEN_EPHEMERAL_MAX_BYTES)? as usize,
            max_inflight_bytes: src.count(&QUEEN_MAX_INFLIGHT_BYTES)? as usize,
            max_reading_bytes: src.count(&QUEEN_MAX_READING_BYTES)? as usize,
            body_timeout: src.duration(&QUEEN_BODY_TIMEOUT_MS)?,
            max_connections: src.count(&QUEEN_MAX_CONNECTIONS)? as usize,
            admin_pool_size: src.count(&QUEEN_ADMIN_POOL_SIZE)? as u32,
            admin_statement_timeout: src.duration(&QUEEN_ADMIN_STATEMENT_TIMEOUT_MS)?,
            partition_max_pending: src.count(&QUEEN_PARTITION_MAX_PENDING)? as usize,
            partition_idle: src.duration(&QUEEN_PARTITION_IDLE_MS)?,
            partition_actors_max: src.count(&QUEEN_PARTITION_ACTORS_MAX)? as usize,
            dedup_sweep_every: src.duration(&QUEEN_DEDUP_SWEEP_MS)?,
            retention_every: src.duration(&RETENTION_INTERVAL)?,
            retention_batch: src.count(&RETENTION_BATCH_SIZE)? as i64,
            replay_every: src.duration(&QUEEN_REPLAY_TICK_MS)?,
            replay_backoff: src.duration(&QUEEN_REPLAY_BACKOFF_MS)?,
            spool_report_every: src.duration(&QUEEN_SPOOL_REPORT_MS)?,
            flag_poll_every: src.duration(&QUEEN_FLAG_POLL_MS)?,
            flag_read_timeout: src.duration(&QUEEN_FLAG_READ_TIMEOUT_MS)?,
            pop_recheck: src.duration(&QUEEN_POP_RECHECK_MS)?,
            pop_ahead: src.duration(&QUEEN_POP_AHEAD_MS)?,
            health_timeout: src.duration(&QUEEN_HEALTH_TIMEOUT_MS)?,
            private_pg_dir: PathBuf::from(src.required(&QUEEN_PRIVATE_PG_DIR)?),
            private_pg_probe: src.required(&QUEEN_PRIVATE_PG_PROBE)?.to_string(),
            file_buffer_dir: PathBuf::from(src.required(&FILE_BUFFER_DIR)?),
            workers: src.opt_count(&NUM_WORKERS)?.unwrap_or(cores as u64) as usize,
            log_level: src.choice(&LOG_LEVEL)?.to_string(),
            log_json: src.choice(&LOG_FORMAT)? == "json",
            metrics: src.flag(&QUEEN_METRICS)?,
            history_interval: src.duration(&QUEEN_HISTORY_INTERVAL_MS)?,
            history_queues: (src.count(&QUEEN_HISTORY_QUEUES)? as usize).min(100),
            lag_live_pairs: src.count(&QUEEN_LAG_LIVE_PAIRS)?.min(i64::MAX as u64) as i64,
            lag_pass_interval: src.duration(&QUEEN_LAG_PASS_MS)?,
            cors_origins: src.list(&QUEEN_CORS_ORIGINS),
            tls: tls_files(src)?,
            jwt: jwt_settings(src)?,
            default_batch: src.count(&DEFAULT_BATCH_SIZE)? as usize,
            default_timeout: src.duration(&DEFAULT_TIMEOUT)?,
            default_subscription_new: src.choice(&DEFAULT_SUBSCRIPTION_MODE)? == "new",
            kafka: kafka_settings(src)?,
            encryption_key: match src.text(&QUEEN_ENCRYPTION_KEY) {
                None => None,
                Some(text) => Some(
                    EncryptionKey::from_hex(&text)
                        .map_err(|reason| invalid(&QUEEN_ENCRYPTION_KEY, "(redacted)", &reason))?,
                ),
            },
        })
    }
}

/// Reads the `QUEEN_KAFKA_*` variables (`None` without `QUEEN_KAFKA_PORT`).
fn kafka_settings(src: &Source) -> Result<Option<KafkaSettings>, SettingsError> {
    use var::*;
    // Every variable is read (and checked) even without a port, so a typo shows at once.
    let port: Option<u16> = match src.given(&QUEEN_KAFKA_PORT) {
        Some(raw) => Some(src.number(&QUEEN_KAFKA_PORT, raw)?),
        None => None,
    };
    let host = src.required(&HOST)?.trim().to_string();
    let advertised_host = match src.text(&QUEEN_KAFKA_ADVERTISED_HOST) {
        Some(h) => h.trim().to_string(),
        None if host == "0.0.0.0" || host == "::" => "127.0.0.1".to_string(),
        None => host,
    };
    let partitions = src.count(&QUEEN_KAFKA_DEFAULT_PARTITIONS)?;
    let default_partitions = i32::try_from(partitions)
        .ok()
        .filter(|n| *n <= 100_000)
        .ok_or_else(|| {
            invalid(
                &QUEEN_KAFKA_DEFAULT_PARTITIONS,
                &partitions.to_string(),
                "at most 100000",
            )
        })?;
    let max_frame = src.bytes(&QUEEN_KAFKA_MAX_FRAME_BYTES)?;
    if max_frame < 1024 {
        return Err(invalid(
            &QUEEN_KAFKA_MAX_FRAME_BYTES,
            &max_frame.to_string(),
            "at least 1024 bytes",
        ));
    }
    let coordinator_lease = src.duration(&QUEEN_KAFKA_COORDINATOR_LEASE_MS)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&coordinator_lease) {
        return Err(invalid(
            &QUEEN_KAFKA_COORDINATOR_LEASE_MS,
            &coordinator_lease.as_millis().to_string(),
            "1000 to 600000 milliseconds",
        ));
    }
    let Some(port) = port else {
        return Ok(None);
    };
    // With JWT_ENABLED the Kafka listener demands SASL (PLAIN or OAUTHBEARER carrying the same
    // tokens) before anything else: no way around the HTTP gate (docs/kafka.md).
    Ok(Some(KafkaSettings {
        port,
        advertised_host,
        default_partitions,
        max_frame_bytes: usize::try_from(max_frame).unwrap_or(usize::MAX),
        coordinator_lease,
    }))
}

/// Reads `QUEEN_TLS_CERT_FILE` and `QUEEN_TLS_KEY_FILE`: both or neither (the files themselves
/// are read by `crate::tls` when the broker starts).
fn tls_files(src: &Source) -> Result<Option<TlsFiles>, SettingsError> {
    use var::*;
    match (
        src.text(&QUEEN_TLS_CERT_FILE),
        src.text(&QUEEN_TLS_KEY_FILE),
    ) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert_file: PathBuf::from(cert),
            key_file: PathBuf::from(key),
        })),
        (Some(cert), None) => Err(invalid(
            &QUEEN_TLS_CERT_FILE,
            &cert,
            "QUEEN_TLS_KEY_FILE must be set too (HTTPS needs the certificate and its key)",
        )),
        (None, Some(key)) => Err(invalid(
            &QUEEN_TLS_KEY_FILE,
            &key,
            "QUEEN_TLS_CERT_FILE must be set too (HTTPS needs the certificate and its key)",
        )),
    }
}

/// Reads the `JWT_*` variables and checks that enabled auth has key material for its algorithm.
fn jwt_settings(src: &Source) -> Result<JwtSettings, SettingsError> {
    use var::*;
    // A security switch: anything but true/false stops the start rather than leaving auth off.
    let enabled = src.flag(&JWT_ENABLED)?;
    let algorithm = match src.choice(&JWT_ALGORITHM)? {
        "RS256" => JwtAlgorithm::Rs256,
        "EdDSA" => JwtAlgorithm::EdDsa,
        "auto" => JwtAlgorithm::Auto,
        _ => JwtAlgorithm::Hs256,
    };
    let secret = src.text(&JWT_SECRET);
    let public_key = src.text(&JWT_PUBLIC_KEY);
    let jwks_url = src.url(&JWT_JWKS_URL)?;
    if enabled {
        let asymmetric = public_key.is_some() || jwks_url.is_some();
        let missing = match algorithm {
            JwtAlgorithm::Hs256 if secret.is_none() => Some("JWT_ALGORITHM=HS256 needs JWT_SECRET"),
            JwtAlgorithm::Rs256 | JwtAlgorithm::EdDsa if !asymmetric => {
                Some("this algorithm needs JWT_PUBLIC_KEY or JWT_JWKS_URL")
            }
            JwtAlgorithm::Auto if secret.is_none() && !asymmetric => {
                Some("JWT_ALGORITHM=auto needs JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL")
            }
            _ => None,
        };
        if let Some(reason) = missing {
            return Err(invalid(
                &JWT_ENABLED,
                "true",
                &format!("no key material: {reason}"),
            ));
        }
    }
    Ok(JwtSettings {
        enabled,
        algorithm,
        secret,
        public_key,
        jwks_url,
        jwks_refresh: src.duration(&JWT_JWKS_REFRESH_INTERVAL)?,
        jwks_timeout: src.duration(&JWT_JWKS_TIMEOUT_MS)?,
        issuer: src.text(&JWT_ISSUER),
        audience: src.text(&JWT_AUDIENCE),
        clock_skew_secs: src.duration(&JWT_CLOCK_SKEW)?.as_secs(),
        skip_paths: src.list(&JWT_SKIP_PATHS),
        roles_claim: src.word(&JWT_ROLES_CLAIM)?,
        roles_array_claim: src.word(&JWT_ROLES_ARRAY_CLAIM)?,
        role_names: RoleNames {
            admin: src.word(&JWT_ROLE_ADMIN)?,
            read_write: src.word(&JWT_ROLE_READ_WRITE)?,
            read_only: src.word(&JWT_ROLE_READ_ONLY)?,
            write_only: src.word(&JWT_ROLE_WRITE_ONLY)?,
        },
    })
}

/// Reads `key = value` pairs from a TOML file, by lower-case key (keys may be written in any
/// case); a key that names no setting is ignored.
fn read_toml(path: &Path) -> Result<HashMap<String, String>, SettingsError> {
    let fail = |reason: String| SettingsError::File {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| fail(e.to_string()))?;
    let mut values = HashMap::new();
    for (key, value) in table {
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Float(f) => f.to_string(),
            other => return Err(fail(format!("key {key}: unsupported value {other}"))),
        };
        values.insert(key.to_ascii_lowercase(), text);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        map.insert("QUEEN_CONFIG".into(), String::new());
        map
    }

    #[test]
    fn a_port_that_is_not_a_number_names_the_variable() {
        let err = Settings::from_map(env(&[("PORT", "http")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("PORT") && err.contains("http"), "{err}");
    }

    #[test]
    fn defaults_are_queens() {
        let s = Settings::from_map(env(&[])).unwrap();
        assert_eq!(s.port, 6632);
        assert_eq!(s.max_body_bytes, 67_108_864);
        assert!(!s.database_configured);
        assert_eq!(
            s.database.url(),
            "postgres://postgres:postgres@localhost:5432/postgres"
        );
    }

    #[test]
    fn database_url_wins_and_is_redacted() {
        let s = Settings::from_map(env(&[
            ("DATABASE_URL", "postgres://u:secret@h:1/d"),
            ("PG_HOST", "x"),
        ]))
        .unwrap();
        assert!(s.database_configured);
        assert_eq!(s.database.url(), "postgres://u:secret@h:1/d");
        assert!(!format!("{s:?}").contains("secret"));
    }

    #[test]
    fn a_pg_host_list_gives_each_host_pg_port_unless_it_names_one() {
        let s = Settings::from_map(env(&[
            ("PG_HOST", "db1, db2:6000,[::1]"),
            ("PG_PORT", "5433"),
            ("PG_PASSWORD", "pw"),
        ]))
        .unwrap();
        assert_eq!(
            s.database.url(),
            "postgres://postgres:pw@db1:5433,db2:6000,[::1]:5433/postgres"
        );
    }

    #[test]
    fn auth_is_off_by_default_with_queens_defaults() {
        let s = Settings::from_map(env(&[])).unwrap();
        assert!(!s.jwt.enabled);
        assert_eq!(s.jwt.algorithm, JwtAlgorithm::Hs256);
        assert_eq!(s.jwt.clock_skew_secs, 30);
        assert_eq!(
            s.jwt.skip_paths,
            ["/health", "/metrics/prometheus", "/metrics", "/"]
        );
        assert_eq!(s.jwt.roles_claim, "role");
        assert_eq!(s.jwt.roles_array_claim, "roles");
        assert_eq!(s.jwt.role_names.write_only, "write-only");
        assert_eq!(s.jwt.jwks_refresh, Duration::from_secs(3600));
        assert_eq!(s.jwt.jwks_timeout, Duration::from_millis(5000));
    }

    #[test]
    fn enabled_auth_without_key_material_names_what_is_missing() {
        let err = Settings::from_map(env(&[("JWT_ENABLED", "true")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("JWT_ENABLED") && err.contains("JWT_SECRET"),
            "{err}"
        );
        for alg in ["RS256", "EdDSA"] {
            let err = Settings::from_map(env(&[
                ("JWT_ENABLED", "true"),
                ("JWT_ALGORITHM", alg),
                ("JWT_SECRET", "s"),
            ]))
            .unwrap_err()
            .to_string();
            assert!(err.contains("JWT_PUBLIC_KEY or JWT_JWKS_URL"), "{err}");
        }
        let err = Settings::from_map(env(&[("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "auto")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("JWT_ALGORITHM=auto"), "{err}");
        assert!(Settings::from_map(env(&[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "auto"),
            ("JWT_JWKS_URL", "http://127.0.0.1:1/jwks"),
        ]))
        .is_ok());
    }

    #[test]
    fn jwt_values_that_do_not_parse_name_the_variable() {
        for (name, value) in [
            ("JWT_ENABLED", "yes"),
            ("JWT_ALGORITHM", "none"),
            ("JWT_ALGORITHM", "HS512"),
            ("JWT_CLOCK_SKEW", "-1"),
            ("JWT_JWKS_TIMEOUT_MS", "0"),
            ("JWT_JWKS_REFRESH_INTERVAL", "soon"),
            ("JWT_JWKS_URL", "ftp://keys"),
        ] {
            let err = Settings::from_map(env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(name), "{name}={value}: {err}");
        }
    }

    #[test]
    fn the_jwt_secret_is_redacted() {
        let s = Settings::from_map(env(&[
            ("JWT_ENABLED", "TRUE"),
            ("JWT_SECRET", "hunter2-secret"),
            ("JWT_ALGORITHM", "eddsa"),
            ("JWT_PUBLIC_KEY", "pem"),
        ]))
        .unwrap();
        assert!(s.jwt.enabled);
        assert_eq!(s.jwt.algorithm, JwtAlgorithm::EdDsa);
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn pop_defaults_and_the_encryption_key_are_read_and_the_key_is_never_shown() {
        let s = Settings::from_map(env(&[])).unwrap();
        assert_eq!(s.default_batch, 1);
        assert_eq!(s.default_timeout, Duration::from_millis(30_000));
        assert!(!s.default_subscription_new);
        assert!(s.encryption_key.is_none());
        let key = "00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff";
        let s = Settings::from_map(env(&[
            ("DEFAULT_BATCH_SIZE", "50"),
            ("DEFAULT_TIMEOUT", "2000"),
            ("DEFAULT_SUBSCRIPTION_MODE", "NEW"),
            ("QUEEN_ENCRYPTION_KEY", key),
        ]))
        .unwrap();
        assert_eq!(
            (s.default_batch, s.default_timeout),
            (50, Duration::from_millis(2000))
        );
        assert!(s.default_subscription_new);
        let bytes = s.encryption_key.as_ref().unwrap().0;
        assert_eq!((bytes[0], bytes[10], bytes[31]), (0x00, 0xaa, 0xff));
        let shown = format!("{s:?}");
        assert!(!shown.to_lowercase().contains("aabbccdd"), "{shown}");
        for (name, value) in [
            ("DEFAULT_BATCH_SIZE", "0"),
            ("DEFAULT_TIMEOUT", "soon"),
            ("DEFAULT_SUBSCRIPTION_MODE", "latest"),
            ("QUEEN_ENCRYPTION_KEY", "abcd"),
        ] {
            let err = Settings::from_map(env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn tls_needs_both_files_and_is_off_by_default() {
        assert_eq!(Settings::from_map(env(&[])).unwrap().tls, None);
        let s = Settings::from_map(env(&[
            ("QUEEN_TLS_CERT_FILE", "/etc/queen/tls/cert.pem"),
            ("QUEEN_TLS_KEY_FILE", "/etc/queen/tls/key.pem"),
        ]))
        .unwrap();
        assert_eq!(
            s.tls,
            Some(TlsFiles {
                cert_file: "/etc/queen/tls/cert.pem".into(),
                key_file: "/etc/queen/tls/key.pem".into(),
            })
        );
        for (set, missing) in [
            ("QUEEN_TLS_CERT_FILE", "QUEEN_TLS_KEY_FILE"),
            ("QUEEN_TLS_KEY_FILE", "QUEEN_TLS_CERT_FILE"),
        ] {
            let err = Settings::from_map(env(&[(set, "/x.pem")]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(set) && err.contains(missing) && err.contains("/x.pem"),
                "{err}"
            );
        }
    }

    #[test]
    fn zero_pool_size_is_refused() {
        let err = Settings::from_map(env(&[("DB_POOL_SIZE", "0")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DB_POOL_SIZE"), "{err}");
    }

    #[test]
    fn the_kafka_listener_is_off_unless_its_port_is_set_and_runs_with_auth() {
        let off = Settings::from_map(env(&[])).expect("defaults");
        assert!(off.kafka.is_none());
        let on = Settings::from_map(env(&[("QUEEN_KAFKA_PORT", "9092")])).expect("kafka on");
        let kafka = on.kafka.expect("kafka settings");
        assert_eq!(kafka.port, 9092);
        // HOST defaults to 0.0.0.0, which is no address to advertise.
        assert_eq!(kafka.advertised_host, "127.0.0.1");
        assert_eq!(kafka.default_partitions, 1);
        let named = Settings::from_map(env(&[
            ("QUEEN_KAFKA_PORT", "0"),
            ("HOST", "10.1.2.3"),
            ("QUEEN_KAFKA_DEFAULT_PARTITIONS", "6"),
        ]))
        .expect("kafka on")
        .kafka
        .expect("kafka settings");
        assert_eq!(
            (named.advertised_host.as_str(), named.default_partitions),
            ("10.1.2.3", 6)
        );
        // With auth on the listener runs too: it demands SASL with the same tokens.
        let with_auth = Settings::from_map(env(&[
            ("QUEEN_KAFKA_PORT", "9092"),
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", "s"),
        ]))
        .expect("kafka with auth");
        assert!(with_auth.jwt.enabled && with_auth.kafka.is_some());
        let err = Settings::from_map(env(&[("QUEEN_KAFKA_PORT", "x")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("QUEEN_KAFKA_PORT"), "{err}");
        assert_eq!(kafka.coordinator_lease, Duration::from_secs(10));
        for bad in ["999", "600001", "0"] {
            let err = Settings::from_map(env(&[
                ("QUEEN_KAFKA_PORT", "9092"),
                ("QUEEN_KAFKA_COORDINATOR_LEASE_MS", bad),
            ]))
            .unwrap_err()
            .to_string();
            assert!(err.contains("QUEEN_KAFKA_COORDINATOR_LEASE_MS"), "{err}");
        }
    }

    #[test]
    fn the_parser_reads_every_row_of_the_table_and_every_default_parses() {
        let src = Source::new(env(&[])).unwrap();
        Settings::from_source(&src).expect("the defaults parse");
        let read = src.read.borrow();
        for v in VARIABLES {
            assert!(
                read.contains(&v.name),
                "{} is in the table but never read",
                v.name
            );
        }
    }

    #[test]
    fn the_table_is_well_formed() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len(), "a variable is listed twice");
        for v in VARIABLES {
            assert!(!v.help.trim().is_empty(), "{} has no meaning", v.name);
            // The file's keys are the variables' names; only the file's own path is not a key.
            let expected = (v.name != "QUEEN_CONFIG").then(|| v.name.to_ascii_lowercase());
            assert_eq!(v.toml.map(str::to_string), expected, "{}", v.name);
        }
    }

    /// What a document holds between `<!-- {marker}: begin -->` and `<!-- {marker}: end -->`.
    fn generated<'a>(doc: &'a str, marker: &str) -> &'a str {
        let begin = format!("<!-- {marker}: begin -->\n");
        let end = format!("<!-- {marker}: end -->");
        let start = doc.find(&begin).expect("begin marker") + begin.len();
        let stop = doc[start..].find(&end).expect("end marker") + start;
        &doc[start..stop]
    }

    #[test]
    fn the_readme_configuration_table_is_the_settings_table() {
        let table = markdown_table();
        assert!(
            generated(include_str!("../README.md"), "settings table") == table,
            "README.md's configuration table is out of date; put this between the markers:\n{table}"
        );
    }

    #[test]
    fn the_example_configuration_is_the_settings_table() {
        let example = example_toml();
        if std::env::var_os("QUEEN_BLESS").is_some_and(|v| v == "1") {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/queen.example.toml");
            std::fs::write(path, &example).expect("write config/queen.example.toml");
            return;
        }
        assert!(
            include_str!("../config/queen.example.toml") == example,
            "config/queen.example.toml is out of date; run \
             `QUEEN_BLESS=1 cargo test --lib example_configuration` to write it again"
        );
    }

    #[test]
    fn the_example_configuration_sets_every_key_once_and_parses_as_the_defaults() {
        // Uncomment every `# key = value` line: the result is TOML holding each file key once.
        let uncommented: String = example_toml()
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ")
                    .is_some_and(|(k, _)| VARIABLES.iter().any(|v| v.toml == Some(k)))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let table: toml::Table = uncommented.parse().expect("the example is TOML");
        for v in VARIABLES {
            match v.toml {
                Some(key) => {
                    let value = table.get(key).unwrap_or_else(|| panic!("{key} is missing"));
                    if let Some(default) = v.default.value() {
                        let text = match value {
                            toml::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        assert_eq!(text, default, "{key} does not show its default");
                    }
                }
                None => assert!(!uncommented.contains(&v.name.to_ascii_lowercase())),
            }
        }
        assert_eq!(
            table.len(),
            VARIABLES.iter().filter(|v| v.toml.is_some()).count()
        );
        // Every value shown (defaults and examples) parses as its setting, bar the TLS files,
        // which must exist, and JWT key material, which needs JWT on to be read in full.
        let path = std::env::temp_dir().join(format!("queen-example-{}.toml", std::process::id()));
        let file: String = uncommented
            .lines()
            .filter(|l| !l.starts_with("queen_tls_") && !l.starts_with("jwt_"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, file).unwrap();
        let parsed = Settings::from_map(env(&[("QUEEN_CONFIG", path.to_str().unwrap())]));
        std::fs::remove_file(&path).unwrap();
        parsed.expect("the example's values parse");
    }

    #[test]
    fn the_operations_guide_authentication_table_is_the_settings_table() {
        let table = markdown_table_of(|v| v.name.starts_with("JWT_"));
        assert!(
            generated(
                include_str!("../docs/operations.md"),
                "settings table JWT_*"
            ) == table,
            "docs/operations.md's JWT table is out of date; put this between the markers:\n{table}"
        );
    }

    #[test]
    fn the_operations_guide_interval_table_is_the_settings_table() {
        let table = markdown_table_of(|v| {
            v.name.starts_with("QUEEN_") && matches!(v.kind, Kind::Millis | Kind::MillisOrZero)
        });
        assert!(
            generated(include_str!("../docs/operations.md"), "settings table QUEEN_*_MS") == table,
            "docs/operations.md's interval table is out of date; put this between the markers:\n{table}"
        );
    }

    #[test]
    fn the_table_renders_defaults_with_units_and_notes() {
        let table = markdown_table();
        assert!(
            table.contains("| `QUEEN_POP_RECHECK_MS` | `1000` ms |"),
            "{table}"
        );
        assert!(
            table.contains("| `JWT_JWKS_REFRESH_INTERVAL` | `3600` s |"),
            "{table}"
        );
        assert!(
            table.contains("| `NUM_WORKERS` | number of cores |"),
            "{table}"
        );
        assert!(table.contains("| `DATABASE_URL` | — |"), "{table}");
        assert!(
            table.contains("`HS256`, `RS256`, `EdDSA` or `auto`"),
            "{table}"
        );
        assert!(table.contains("; environment only"), "{table}");
        assert_eq!(table.lines().count(), VARIABLES.len() + 2);
    }

    #[test]
    fn intervals_default_to_what_was_hard_coded_and_can_be_set() {
        let s = Settings::from_map(env(&[])).unwrap();
        assert_eq!(s.flag_poll_every, Duration::from_secs(1));
        assert_eq!(s.flag_read_timeout, Duration::from_secs(2));
        assert_eq!(s.replay_every, Duration::from_millis(250));
        assert_eq!(s.replay_backoff, Duration::from_millis(100));
        assert_eq!(s.pop_recheck, Duration::from_secs(1));
        assert_eq!(s.health_timeout, Duration::from_secs(2));
        assert_eq!(s.spool_report_every, Duration::from_secs(10));
        let s = Settings::from_map(env(&[
            ("QUEEN_FLAG_POLL_MS", "20"),
            ("QUEEN_FLAG_READ_TIMEOUT_MS", "21"),
            ("QUEEN_REPLAY_TICK_MS", "22"),
            ("QUEEN_REPLAY_BACKOFF_MS", "23"),
            ("QUEEN_POP_RECHECK_MS", "24"),
            ("QUEEN_HEALTH_TIMEOUT_MS", "25"),
            ("QUEEN_SPOOL_REPORT_MS", "26"),
        ]))
        .unwrap();
        let ms = Duration::from_millis;
        assert_eq!(
            [
                s.flag_poll_every,
                s.flag_read_timeout,
                s.replay_every,
                s.replay_backoff,
                s.pop_recheck,
                s.health_timeout,
                s.spool_report_every
            ],
            [ms(20), ms(21), ms(22), ms(23), ms(24), ms(25), ms(26)]
        );
        let err = Settings::from_map(env(&[("QUEEN_POP_RECHECK_MS", "0")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("QUEEN_POP_RECHECK_MS"), "{err}");
    }

    #[test]
    fn the_file_is_read_by_key_in_any_case_under_the_environment() {
        let path = std::env::temp_dir().join(format!("queen-settings-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "port = 7000\nQueen_Pop_Recheck_Ms = 40\nlog_level = \"debug\"\nunknown_key = 1\n",
        )
        .unwrap();
        let mut vars = env(&[("LOG_LEVEL", "warn")]);
        vars.insert("QUEEN_CONFIG".into(), path.display().to_string());
        let s = Settings::from_map(vars.clone());
        vars.insert("PORT".into(), String::new()); // set but empty: the default, not the file
        let emptied = Settings::from_map(vars);
        std::fs::remove_file(&path).unwrap();
        let s = s.unwrap();
        assert_eq!(s.port, 7000);
        assert_eq!(s.pop_recheck, Duration::from_millis(40));
        assert_eq!(s.log_level, "warn");
        assert_eq!(emptied.unwrap().port, 6632);
    }

    #[test]
    fn a_bad_url_is_named_with_its_password_redacted() {
        let err = Settings::from_map(env(&[("DATABASE_URL", "mysql://u:pw@h/d")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DATABASE_URL") && !err.contains("pw"), "{err}");
    }

    #[test]
    fn the_command_line_is_the_table() {
        let help = command().render_long_help().to_string();
        for v in VARIABLES {
            assert!(
                help.contains(&format!("--{} ", flag_of(v))) && help.contains(v.name),
                "--help does not show {}:\n{help}",
                v.name
            );
        }
        assert!(help.contains("[default: 6632]"), "{help}");
        assert_eq!(command().get_arguments().count(), VARIABLES.len());
    }

    #[test]
    fn a_flag_wins_over_its_variable_and_config_names_the_file() {
        let s = Settings::from_command_line(
            ["queen-broker", "--port", "7001", "--log-format", "json"],
            env(&[("PORT", "7000")]),
        )
        .unwrap();
        assert_eq!(s.port, 7001);
        assert!(s.log_json);
        let err = Settings::from_command_line(
            ["queen-broker", "--config", "/nonexistent/queen.toml"],
            HashMap::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/queen.toml"), "{err}");
    }

    #[test]
    fn a_bad_argument_is_named() {
        let err = Settings::from_command_line(["queen-broker", "--port", "http"], env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--port (PORT)") && err.contains("http"),
            "{err}"
        );
        let err =
            Settings::from_command_line(["queen-broker", "--prot", "1"], env(&[])).unwrap_err();
        assert!(matches!(err, CommandLineError::Args(_)));
        assert!(err.to_string().contains("--prot"), "{err}");
        let help = Settings::from_command_line(["queen-broker", "--help"], env(&[])).unwrap_err();
        match help {
            CommandLineError::Args(e) => assert_eq!(e.exit_code(), 0),
            other => panic!("--help: {other}"),
        }
    }
}
