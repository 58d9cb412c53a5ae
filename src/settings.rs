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
        "committer actors, each with its own connection (default 2)",
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
    (
        "JWT_ENABLED",
        "require a bearer JWT (true or false, default false)",
    ),
    (
        "JWT_ALGORITHM",
        "HS256, RS256, EdDSA or auto (default HS256)",
    ),
    (
        "JWT_SECRET",
        "HS256 shared secret (secret; redacted in logs)",
    ),
    (
        "JWT_PUBLIC_KEY",
        "RS256/EdDSA public key, PEM text (wins over JWT_JWKS_URL)",
    ),
    ("JWT_JWKS_URL", "RS256/EdDSA key set URL (http or https)"),
    (
        "JWT_JWKS_REFRESH_INTERVAL",
        "seconds a fetched key set is used before refetching (default 3600)",
    ),
    (
        "JWT_JWKS_TIMEOUT_MS",
        "key set fetch timeout in ms (default 5000)",
    ),
    ("JWT_ISSUER", "required iss claim (default: not checked)"),
    ("JWT_AUDIENCE", "required aud member (default: not checked)"),
    (
        "JWT_CLOCK_SKEW",
        "leeway in seconds for exp, nbf and iat (default 30)",
    ),
    (
        "JWT_SKIP_PATHS",
        "paths served without a token (default /health,/metrics/prometheus,/metrics,/)",
    ),
    (
        "JWT_ROLES_CLAIM",
        "string claim holding one role (default role)",
    ),
    (
        "JWT_ROLES_ARRAY_CLAIM",
        "string-array claim holding roles (default roles)",
    ),
    ("JWT_ROLE_ADMIN", "role value of operators (default admin)"),
    (
        "JWT_ROLE_READ_WRITE",
        "role value of producers and consumers (default read-write)",
    ),
    (
        "JWT_ROLE_READ_ONLY",
        "role value of read-only viewers (default read-only)",
    ),
    (
        "JWT_ROLE_WRITE_ONLY",
        "role value that may only push (default write-only)",
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
    /// Items one committer holds before the next one is used.
    pub committer_spill_items: usize,
    /// Longest a commit may take before its items are spooled.
    pub commit_timeout: Duration,
    /// Bytes of committed segments kept in memory for pops and acks (0: none).
    pub segment_cache_bytes: usize,
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
    /// Where a local PostgreSQL is looked for before a private one is started.
    pub private_pg_probe: String,
    /// Spool directory.
    pub file_buffer_dir: PathBuf,
    /// HTTP workers.
    pub workers: usize,
    /// Log level.
    pub log_level: String,
    /// Authentication (`JWT_*`).
    pub jwt: JwtSettings,
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

/// The default of `JWT_SKIP_PATHS`.
pub const DEFAULT_SKIP_PATHS: &str = "/health,/metrics/prometheus,/metrics,/";

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
            committers: src.positive("QUEEN_COMMITTERS", 2)? as usize,
            committer_spill_items: src.positive("QUEEN_COMMITTER_SPILL_ITEMS", 256)? as usize,
            commit_timeout: Duration::from_millis(src.positive("QUEEN_COMMIT_TIMEOUT_MS", 10_000)?),
            segment_cache_bytes: src.parse(
                "QUEEN_SEGMENT_CACHE_BYTES",
                16 * 1024 * 1024,
                "expected a number of bytes",
            )?,
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
            private_pg_probe: src
                .get("QUEEN_PRIVATE_PG_PROBE")
                .unwrap_or("127.0.0.1:5432")
                .to_string(),
            file_buffer_dir: PathBuf::from(
                src.get("FILE_BUFFER_DIR")
                    .unwrap_or("/var/lib/queen/buffers"),
            ),
            workers: src.positive("NUM_WORKERS", cores as u64)? as usize,
            log_level,
            jwt: jwt_settings(&src)?,
        })
    }
}

fn invalid(name: &str, value: &str, reason: &str) -> SettingsError {
    SettingsError::Invalid {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Reads the `JWT_*` variables and checks that enabled auth has key material for its algorithm.
fn jwt_settings(src: &Source) -> Result<JwtSettings, SettingsError> {
    // A security switch: anything but true/false stops the start rather than leaving auth off.
    let enabled = match src.get("JWT_ENABLED").map(str::trim) {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => return Err(invalid("JWT_ENABLED", v, "expected true or false")),
    };
    let algorithm = match src.get("JWT_ALGORITHM").map(str::trim) {
        None => JwtAlgorithm::Hs256,
        Some(v) if v.eq_ignore_ascii_case("HS256") => JwtAlgorithm::Hs256,
        Some(v) if v.eq_ignore_ascii_case("RS256") => JwtAlgorithm::Rs256,
        Some(v) if v.eq_ignore_ascii_case("EdDSA") => JwtAlgorithm::EdDsa,
        Some(v) if v.eq_ignore_ascii_case("auto") => JwtAlgorithm::Auto,
        Some(v) => {
            return Err(invalid(
                "JWT_ALGORITHM",
                v,
                "expected HS256, RS256, EdDSA or auto",
            ))
        }
    };
    let text = |name: &str| src.get(name).map(str::to_string);
    let named = |name: &str, default: &str| src.get(name).unwrap_or(default).trim().to_string();
    let secret = text("JWT_SECRET");
    let public_key = text("JWT_PUBLIC_KEY");
    let jwks_url = text("JWT_JWKS_URL").map(|u| u.trim().to_string());
    if let Some(url) = &jwks_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "JWT_JWKS_URL",
                url,
                "expected an http:// or https:// URL",
            ));
        }
    }
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
                "JWT_ENABLED",
                "true",
                &format!("no key material: {reason}"),
            ));
        }
    }
    let skip_paths = src
        .get("JWT_SKIP_PATHS")
        .unwrap_or(DEFAULT_SKIP_PATHS)
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    Ok(JwtSettings {
        enabled,
        algorithm,
        secret,
        public_key,
        jwks_url,
        jwks_refresh: Duration::from_secs(src.positive("JWT_JWKS_REFRESH_INTERVAL", 3600)?),
        jwks_timeout: Duration::from_millis(src.positive("JWT_JWKS_TIMEOUT_MS", 5000)?),
        issuer: text("JWT_ISSUER"),
        audience: text("JWT_AUDIENCE"),
        clock_skew_secs: src.parse(
            "JWT_CLOCK_SKEW",
            30u64,
            "expected a number of seconds (0 or more)",
        )?,
        skip_paths,
        roles_claim: named("JWT_ROLES_CLAIM", "role"),
        roles_array_claim: named("JWT_ROLES_ARRAY_CLAIM", "roles"),
        role_names: RoleNames {
            admin: named("JWT_ROLE_ADMIN", "admin"),
            read_write: named("JWT_ROLE_READ_WRITE", "read-write"),
            read_only: named("JWT_ROLE_READ_ONLY", "read-only"),
            write_only: named("JWT_ROLE_WRITE_ONLY", "write-only"),
        },
    })
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
    fn zero_pool_size_is_refused() {
        let err = Settings::from_map(env(&[("DB_POOL_SIZE", "0")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DB_POOL_SIZE"), "{err}");
    }
}
