//! `queen.system_state`: flags every broker on the database follows (maintenance modes).

use sqlx::PgExecutor;

use crate::storage::error::StorageError;

/// Key of push maintenance mode.
pub const MAINTENANCE: &str = "maintenance_mode";
/// Key of pop maintenance mode.
pub const POP_MAINTENANCE: &str = "pop_maintenance_mode";

/// Reads a `{"enabled": bool}` flag; absent means off.
///
/// # Errors
///
/// Any database error.
pub async fn flag<'e>(db: impl PgExecutor<'e>, key: &str) -> Result<bool, StorageError> {
    let enabled: Option<bool> = sqlx::query_scalar(
        "SELECT (value ->> 'enabled')::boolean
           FROM queen.system_state
          WHERE key = $1",
    )
    .bind(key)
    .fetch_optional(db)
    .await?
    .flatten();
    Ok(enabled.unwrap_or(false))
}

/// Stores a `{"enabled": bool}` flag.
///
/// # Errors
///
/// Any database error.
pub async fn set_flag<'e>(
    db: impl PgExecutor<'e>,
    key: &str,
    enabled: bool,
) -> Result<(), StorageError> {
    sqlx::query(
        "INSERT INTO queen.system_state (key, value, updated_at)
         VALUES ($1, jsonb_build_object('enabled', $2::boolean), now())
         ON CONFLICT (key) DO UPDATE
            SET value = EXCLUDED.value,
                updated_at = EXCLUDED.updated_at",
    )
    .bind(key)
    .bind(enabled)
    .execute(db)
    .await?;
    Ok(())
}

/// A round trip: `SELECT 1`, true when it answers 1 (the readiness probe).
///
/// # Errors
///
/// Any database error.
pub async fn round_trip<'e>(db: impl PgExecutor<'e>) -> Result<bool, StorageError> {
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(db).await?;
    Ok(one == 1)
}

/// Live leases of every broker on the database (the `queen_leases_held` gauge).
///
/// # Errors
///
/// Any database error.
pub async fn live_leases<'e>(db: impl PgExecutor<'e>) -> Result<i64, StorageError> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM queen.partition_consumers WHERE lease_expires_at > now()",
    )
    .fetch_one(db)
    .await?;
    Ok(n)
}
