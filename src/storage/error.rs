//! [`StorageError`], the one error type of `src/storage`, and the one answer to "is PostgreSQL
//! away?" ([`StorageError::is_unreachable`]) that every caller uses: the commit path
//! (`storage::push::commit::classify`, so the partition actors spool), the spool replay (through the
//! same store), the HTTP edge (503 versus 500), the transaction route (retry versus roll back
//! and report), start-up migrations (serve and migrate later versus refuse to start) and the
//! maintenance-flag poller (keep the last flags quietly versus warn).
//!
//! What counts as unreachable, i.e. "retry later, nothing was decided":
//! - the connection could not be made or broke: `Io` (refused, reset, EOF), `Tls`,
//!   `WorkerCrashed`, and the protocol error sqlx reports when the socket closes before the
//!   answer to its SSLRequest (TLS is compiled in, so every connection starts with one);
//! - the pool could not hand out a connection in time or is closed: `PoolTimedOut`,
//!   `PoolClosed`;
//! - SQLSTATE class 08 (connection exception, e.g. 08006 connection failure, 08001 cannot
//!   connect);
//! - SQLSTATE class 57 (operator intervention): 57P01 admin shutdown (a fast or smart stop, or
//!   `pg_terminate_backend` on the session), 57P02 crash shutdown, 57P03 cannot connect now
//!   (starting up or in recovery), 57P04 database dropped, and 57014 query canceled, which is
//!   also what `statement_timeout` raises: a server too slow to answer within the statement
//!   timeout is treated like one that does not answer, the same rule the commit path applies
//!   to its own commit timeout. The statement rolled back, so a retry is safe;
//! - SQLSTATE 25006 (read_only_sql_transaction): the host no longer accepts writes (a primary
//!   made read-only or demoted, or a standby) — a switchover in progress, not anything wrong
//!   with the data: the pushes are spooled and replayed on the new primary, never quarantined
//!   (`storage::cluster::hosts` looks for the host that accepts writes).
//!
//! Everything else (a constraint, a lock timeout 55P03, serialization 40001, deadlock 40P01,
//! a corrupt stored segment, a payload that is not JSON) is "this operation failed": the HTTP
//! edge answers 500, the transaction route rolls back and reports it, a commit fails its items.
//! (A committer that cannot open its own connection at all, or whose commit outlives
//! `commit_timeout`, also counts as unreachable: see `storage::push::commit::PgStore`.)
//!
//! `tests/storage_errors.rs` checks this against real errors from a real PostgreSQL.

/// A `frames` value that cannot be decoded (`storage::segments::frames`; it lives here so
/// that the errors import nothing of the storage groups above them).
#[derive(Debug, thiserror::Error)]
#[error("corrupt segment frames: {0}")]
pub struct FrameError(pub(crate) &'static str);

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A statement or the connection failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The migrations could not be applied (other than a failed statement or PostgreSQL being
    /// away, which are [`StorageError::Database`]).
    #[error("migrations failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A stored segment's frames do not decode.
    #[error("partition {partition}: {source}")]
    CorruptSegment {
        /// The partition's id.
        partition: i64,
        /// What is wrong with the bytes.
        #[source]
        source: FrameError,
    },
    /// A stored payload is not JSON (it was validated on the way in, so this is corruption).
    #[error("{what} holds a payload that is not JSON: {source}")]
    PayloadNotJson {
        /// Which message or letter.
        what: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A partition that a write needed could not be created, or was deleted meanwhile.
    #[error("{0}")]
    PartitionGone(String),
    /// PostgreSQL answered something the statement rules out (a bug here, never bad input).
    #[error("{0}")]
    Inconsistent(String),
}

impl StorageError {
    /// Whether PostgreSQL is unreachable or going away (retryable), rather than "this
    /// operation failed"; the module docs list what counts.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Database(e) => sqlx_unreachable(e),
            _ => false,
        }
    }

    /// Whether PostgreSQL refused a value (SQLSTATE class 22, data exception, e.g. 22021 a NUL
    /// byte in text; class 23, integrity constraint violation): the data's fault, which
    /// retrying the same data cannot fix. Missing tables, locks, deadlocks and the like are not.
    pub fn is_refused_value(&self) -> bool {
        self.sqlstate()
            .is_some_and(|c| c.starts_with("22") || c.starts_with("23"))
    }

    /// The SQLSTATE of a database error, if PostgreSQL sent one.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            Self::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
            _ => None,
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StorageError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        match e {
            sqlx::migrate::MigrateError::Execute(e) => Self::Database(e),
            other => Self::Migrate(other),
        }
    }
}

/// What sqlx says when the answer to its SSLRequest is not `S` or `N` (an EOF reads as 0x00).
const SSL_REQUEST_CUT: &str = "unexpected response from SSLRequest";

fn sqlx_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // With TLS compiled in, sqlx opens every connection (sslmode prefer, the default) with
        // an SSLRequest; a peer that closes the socket at once (a server going down, a proxy
        // with no backend) reads as a zero byte there, reported as a protocol error.
        sqlx::Error::Protocol(msg) => msg.contains(SSL_REQUEST_CUT),
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57") || c == "25006"),
        _ => false,
    }
}
