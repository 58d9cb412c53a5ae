//! Settings: Queen's environment variables first, then an optional TOML file in `config/`.
//!
//! Every variable the broker reads is listed in [`VARIABLES`], the one table of names. A value
//! that does not parse stops the start with a message naming the variable. Secrets are redacted
//! in `Debug` output.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every environment variable the broker reads, with its meaning (also the TOML keys, lower case).
pub const VARIABLES: &[(&str, &str)] = &[
    ("HOST", "bind address (default 0.0.0.0)"),
    ("PORT", "HTTP port (default 6632)"),
    (
        "DATABASE_URL",
        "PostgreSQL URL; wins over the PG_* variables",
    ),
    ("PG_HOST", "PostgreSQL host (default localhost)"),
    ("PG_PORT", "PostgreSQL port (default 5432)"),
    ("PG_USER", "PostgreSQL user (default postgres)"),
    ("PG_PASSWORD", "PostgreSQL password (default postgres)"),
    ("PG_DB", "PostgreSQL database (default postgres)"),
    (
        "DB_POOL_SIZE",
        "connections of the shared pool (default 20)",
    ),
    (
        "DB_STATEMENT_TIMEOUT",
        "statement timeout in ms (default 30000)",
    ),
    ("DB_LOCK_TIMEOUT", "lock timeout in ms (default 10000)"),
    (
        "DB_CONNECTION_TIMEOUT",
        "connect timeout in ms (default 2000)",
    ),
    (
        "QUEEN_MAX_BODY_BYTES",
        "largest accepted request body (default 67108864)",
    ),
    (
        "QUEEN_COMMITTERS",
        "committer actors, each with its own connection (default 4)",
    ),
    (
        "QUEEN_MAX_INFLIGHT_BYTES",
        "request bytes held in the write path before 503 (default 268435456)",
    ),
    (
        "QUEEN_PARTITION_MAX_PENDING",
        "items waiting in one partition before 503 (default 100000)",
    ),
    (
        "QUEEN_PARTITION_IDLE_MS",
        "an idle partition actor stops after this (default 30000)",
    ),
    (
        "QUEEN_DEDUP_SWEEP_MS",
        "interval of the expired dedup-key sweep (default 60000)",
    ),
    (
        "RETENTION_INTERVAL",
        "interval of the retention sweep in ms (default 300000)",
    ),
    (
        "RETENTION_BATCH_SIZE",
        "segments one retention statement removes at most (default 1000)",
    ),
    (
        "QUEEN_PRIVATE_PG_DIR",
        "data folder of the private PostgreSQL (default .queen/postgres)",
    ),
    (
        "FILE_BUFFER_DIR",
        "spool directory (default /var/lib/queen/buffers)",
    ),
    (
        "NUM_WORKERS",
        "HTTP worker threads (default: number of cores)",
    ),
    (
        "LOG_LEVEL",
        "trace, debug, info, warn or error (default info)",
    ),
    (
        "QUEEN_CONFIG",
        "path of the TOML file (default config/queen.toml when present)",
    ),
];

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
                format!("postgres://{user}:{password}@{host}:{port}/{database}")
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
    /// Lock timeout.
    pub lock_timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Number of committers.
    pub committers: usize,
    /// Request bytes in the write path before 503.
    pub max_inflight_bytes: usize,
    /// Items waiting per partition before 503.
    pub partition_max_pending: usize,
    /// Idle time after which a partition actor stops.
    pub partition_idle: Duration,
    /// Dedup sweep interval.
    pub dedup_sweep_every: Duration,
    /// Retention sweep interval.
    pub retention_every: Duration,
    /// Segments one retention statement removes at most.
    pub retention_batch: i64,
    /// Data folder of the private PostgreSQL.
    pub private_pg_dir: PathBuf,
    /// Spool directory.
    pub file_buffer_dir: PathBuf,
    /// HTTP workers.
    pub workers: usize,
    /// Log level.
    pub log_level: String,
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

/// Raw values by variable name, from the environment over the config file.
struct Source {
    values: HashMap<String, String>,
}

impl Source {
    fn get(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn parse<T: std::str::FromStr>(
        &self,
        name: &str,
        default: T,
        reason: &str,
    ) -> Result<T, SettingsError> {
        match self.get(name) {
            None => Ok(default),
            Some(raw) => raw.trim().parse().map_err(|_| SettingsError::Invalid {
                name: name.to_string(),
                value: raw.to_string(),
                reason: reason.to_string(),
            }),
        }
    }

    fn positive(&self, name: &str, default: u64) -> Result<u64, SettingsError> {
        let value: u64 = self.parse(name, default, "expected a positive integer")?;
        if value == 0 {
            return Err(SettingsError::Invalid {
                name: name.to_string(),
                value: "0".into(),
                reason: "expected a positive integer".into(),
            });
        }
        Ok(value)
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
        let file = match env.get("QUEEN_CONFIG").filter(|p| !p.is_empty()) {
            Some(path) => Some(PathBuf::from(path)),
            None => Some(PathBuf::from("config/queen.toml")).filter(|p| p.exists()),
        };
        let mut values = match file {
            Some(path) => read_toml(&path)?,
            None => HashMap::new(),
        };
        values.extend(env);
        let src = Source { values };

        let database_url = src.get("DATABASE_URL").map(str::to_string);
        let pg_names = ["PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB"];
        let database_configured =
            database_url.is_some() || pg_names.iter().any(|n| src.get(n).is_some());
        let database = match database_url {
            Some(url) => {
                if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    return Err(SettingsError::Invalid {
                        name: "DATABASE_URL".into(),
                        value: redact_url(&url),
                        reason: "expected a postgres:// URL".into(),
                    });
                }
                Database::Url(url)
            }
            None => Database::Parts {
                host: src.get("PG_HOST").unwrap_or("localhost").to_string(),
                port: src.parse("PG_PORT", 5432u16, "expected a port number (1-65535)")?,
                user: src.get("PG_USER").unwrap_or("postgres").to_string(),
                password: src.get("PG_PASSWORD").unwrap_or("postgres").to_string(),
                database: src.get("PG_DB").unwrap_or("postgres").to_string(),
            },
        };
        let port: u16 = src.parse("PORT", 6632, "expected a port number (0-65535)")?;
        let log_level = src.get("LOG_LEVEL").unwrap_or("info").to_ascii_lowercase();
        if !["trace", "debug", "info", "warn", "error", "off"].contains(&log_level.as_str()) {
            return Err(SettingsError::Invalid {
                name: "LOG_LEVEL".into(),
                value: log_level,
                reason: "expected trace, debug, info, warn, error or off".into(),
            });
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Self {
            host: src.get("HOST").unwrap_or("0.0.0.0").to_string(),
            port,
            database,
            database_configured,
            db_pool_size: src.positive("DB_POOL_SIZE", 20)? as u32,
            statement_timeout: Duration::from_millis(src.positive("DB_STATEMENT_TIMEOUT", 30_000)?),
            lock_timeout: Duration::from_millis(src.positive("DB_LOCK_TIMEOUT", 10_000)?),
            connect_timeout: Duration::from_millis(src.positive("DB_CONNECTION_TIMEOUT", 2_000)?),
            max_body_bytes: src.positive("QUEEN_MAX_BODY_BYTES", 64 * 1024 * 1024)? as usize,
            committers: src.positive("QUEEN_COMMITTERS", 4)? as usize,
            max_inflight_bytes: src.positive("QUEEN_MAX_INFLIGHT_BYTES", 256 * 1024 * 1024)?
                as usize,
            partition_max_pending: src.positive("QUEEN_PARTITION_MAX_PENDING", 100_000)? as usize,
            partition_idle: Duration::from_millis(src.positive("QUEEN_PARTITION_IDLE_MS", 30_000)?),
            dedup_sweep_every: Duration::from_millis(src.positive("QUEEN_DEDUP_SWEEP_MS", 60_000)?),
            retention_every: Duration::from_millis(src.positive("RETENTION_INTERVAL", 300_000)?),
            retention_batch: src.positive("RETENTION_BATCH_SIZE", 1_000)? as i64,
            private_pg_dir: PathBuf::from(
                src.get("QUEEN_PRIVATE_PG_DIR").unwrap_or(".queen/postgres"),
            ),
            file_buffer_dir: PathBuf::from(
                src.get("FILE_BUFFER_DIR")
                    .unwrap_or("/var/lib/queen/buffers"),
            ),
            workers: src.positive("NUM_WORKERS", cores as u64)? as usize,
            log_level,
        })
    }
}

/// Reads `KEY = value` pairs from a TOML file; keys may be written in lower case.
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
        values.insert(key.to_ascii_uppercase(), text);
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
    fn zero_pool_size_is_refused() {
        let err = Settings::from_map(env(&[("DB_POOL_SIZE", "0")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DB_POOL_SIZE"), "{err}");
    }
}
