//! The one answer to "is PostgreSQL away?" for every database error the broker sees.

/// Whether a database error means "PostgreSQL is unreachable or going away" (retryable) rather
/// than "this statement failed".
pub fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 08: connection exception; class 57: operator intervention (shutdown, ...).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57")),
        _ => false,
    }
}
