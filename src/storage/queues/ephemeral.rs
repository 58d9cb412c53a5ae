//! The declared configuration of ephemeral queues (`queen.ephemeral_queues`): the only part of
//! an ephemeral queue that PostgreSQL keeps. Contents live in one broker's memory
//! (`crate::ephemeral`) and are never written here.
//!
//! Options are stored as the JSON object the broker validated; this file never decides what
//! an option means.

use sqlx::PgConnection;

use crate::storage::error::StorageError;

/// Stores (or replaces) the options of `queue`.
///
/// # Errors
///
/// Any database error.
pub async fn save(
    conn: &mut PgConnection,
    queue: &str,
    options: &serde_json::Value,
) -> Result<(), StorageError> {
    sqlx::query(
        "INSERT INTO queen.ephemeral_queues (name, options)
         VALUES ($1, $2::jsonb)
         ON CONFLICT (name) DO UPDATE
            SET options = EXCLUDED.options,
                updated_at = now()",
    )
    .bind(queue)
    .bind(options.to_string())
    .execute(conn)
    .await?;
    Ok(())
}

/// Forgets the options of `queue`; whether there were any.
///
/// # Errors
///
/// Any database error.
pub async fn remove(conn: &mut PgConnection, queue: &str) -> Result<bool, StorageError> {
    let done = sqlx::query("DELETE FROM queen.ephemeral_queues WHERE name = $1")
        .bind(queue)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Every declared queue with its options, by name.
///
/// # Errors
///
/// Any database error.
pub async fn all(
    conn: &mut PgConnection,
) -> Result<Vec<(String, serde_json::Value)>, StorageError> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT name, options::text FROM queen.ephemeral_queues ORDER BY name")
            .fetch_all(conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(n, o)| (n, serde_json::from_str(&o).unwrap_or_default()))
        .collect())
}

/// The stored options of `queue`, if it was declared.
///
/// # Errors
///
/// Any database error.
pub async fn get(
    conn: &mut PgConnection,
    queue: &str,
) -> Result<Option<serde_json::Value>, StorageError> {
    let row: Option<String> =
        sqlx::query_scalar("SELECT options::text FROM queen.ephemeral_queues WHERE name = $1")
            .bind(queue)
            .fetch_optional(conn)
            .await?;
    Ok(row.map(|o| serde_json::from_str(&o).unwrap_or_default()))
}
