//! The KV sweeper: deletes rows that expired, in small batches, so the table does not keep
//! dead keys forever. It only tidies: every statement of `storage::kv` already treats an
//! expired row as absent, so when (or whether) the sweeper runs changes no answer.

use std::time::Duration;

use sqlx::PgConnection;

use crate::storage::error::StorageError;

/// How often the sweeper looks for expired rows.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Rows one sweep statement deletes at most (a short transaction; the next batch follows).
pub const SWEEP_BATCH: i64 = 1_000;

/// Deletes up to `batch` expired rows; returns how many.
///
/// The outer `expires_at` test is evaluated again on a row that a writer changed meanwhile, so
/// a key renewed between the scan and the delete stays.
///
/// # Errors
///
/// Any database error.
pub async fn sweep_expired(conn: &mut PgConnection, batch: i64) -> Result<u64, StorageError> {
    let done = sqlx::query(
        "DELETE FROM queen.kv k
          USING (SELECT namespace, key
                   FROM queen.kv
                  WHERE expires_at <= statement_timestamp()
                  ORDER BY expires_at
                  LIMIT $1) AS dead
          WHERE k.namespace = dead.namespace
            AND k.key = dead.key
            AND k.expires_at <= statement_timestamp()",
    )
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// The `kv-sweeper` task: every `every`, deletes expired rows batch after batch until none is
/// left. Errors are logged and retried at the next tick.
pub async fn sweep_loop(pool: sqlx::PgPool, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let mut total = 0u64;
        loop {
            let batch = match pool.acquire().await {
                Ok(mut conn) => sweep_expired(&mut conn, SWEEP_BATCH).await,
                Err(e) => Err(e.into()),
            };
            match batch {
                Ok(n) => {
                    total += n;
                    if n < SWEEP_BATCH as u64 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "kv sweep failed; retrying at the next interval");
                    break;
                }
            }
        }
        if total > 0 {
            tracing::debug!(rows = total, "swept expired kv rows");
        }
    }
}
