//! The dedup sidecar: one narrow row per message (partition, 64-bit hash of its transactionId,
//! offset, time), probed under the partition row lock before offsets are allocated.
//!
//! The hash only narrows the search: a hit is confirmed by reading the original frame and
//! comparing the full transactionId, so dedup stays exact while the original's segment exists.
//! When it is gone (retention, still inside the window) the hash alone decides, so the hash is
//! keyed: SipHash-2-4 under the database's own secret (`queen.dedup_secret`, migration 0007),
//! read in the same statement that locks the partitions. Without the secret a collision
//! cannot be crafted; by chance, two of `n` keys of one partition inside one window share a
//! hash with probability about n² / 2^65 (10^6 keys: 2.7 · 10^-8).

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;
use crate::storage::segments::frames;

/// The database's dedup secret (32 bytes; SipHash takes the first 16 as its key).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret([u8; 16]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret from its stored bytes.
    ///
    /// # Errors
    ///
    /// [`StorageError::Inconsistent`] when the stored value is too short.
    pub fn from_stored(bytes: &[u8]) -> Result<Self, StorageError> {
        let key: [u8; 16] = bytes
            .get(..16)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                StorageError::Inconsistent("queen.dedup_secret is shorter than 16 bytes".into())
            })?;
        Ok(Self(key))
    }
}

/// The SQL expression that reads the secret (one row, made by migration 0007).
pub const SECRET_SQL: &str = "(SELECT secret FROM queen.dedup_secret)";

/// Reads the database's secret.
///
/// # Errors
///
/// Any database error.
pub async fn secret(conn: &mut PgConnection) -> Result<Secret, StorageError> {
    let bytes: Vec<u8> = sqlx::query_scalar(&format!("SELECT {SECRET_SQL}"))
        .fetch_one(conn)
        .await?;
    Secret::from_stored(&bytes)
}

/// The 64-bit key hash stored in the sidecar: SipHash-2-4 of the transactionId under `secret`.
pub fn key_hash(secret: &Secret, transaction_id: &str) -> i64 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher24::new_with_key(&secret.0);
    h.write(transaction_id.as_bytes());
    h.finish() as i64
}

/// One probe: this partition, this key hash, this queue's window. The probe itself runs inside
/// the commit's write statement (`storage::push::commit`), so a batch without duplicates costs no
/// extra round trip.
pub struct Probe {
    /// Partition id.
    pub partition_id: i64,
    /// Key hash.
    pub hash: i64,
    /// Window in seconds (> 0).
    pub window_secs: i32,
}

/// What the stored message at an offset is.
#[derive(Debug, Clone, PartialEq)]
pub enum Original {
    /// The frame is there: its id and transactionId.
    Found {
        /// Message id.
        id: Uuid,
        /// Its transactionId.
        transaction_id: String,
    },
    /// The segment holding the offset is gone (retention).
    Gone,
}

/// (partition, offset, segment base, segment count, segment frames) of one looked-up offset.
type OriginalRow = (i64, i64, Option<i64>, Option<i32>, Option<Vec<u8>>);

/// Reads the messages at these (partition, offset) pairs from their segments.
///
/// # Errors
///
/// Any database error; a segment that does not decode is reported as a protocol error.
pub async fn originals(
    conn: &mut PgConnection,
    at: &[(i64, i64)],
) -> Result<HashMap<(i64, i64), Original>, StorageError> {
    let pids: Vec<i64> = at.iter().map(|a| a.0).collect();
    let offsets: Vec<i64> = at.iter().map(|a| a.1).collect();
    let rows: Vec<OriginalRow> = sqlx::query_as(
        "SELECT x.partition_id, x.msg_offset, s.base_offset, s.msg_count, s.frames
           FROM unnest($1::int8[], $2::int8[]) AS x(partition_id, msg_offset)
           LEFT JOIN LATERAL (
                SELECT base_offset, msg_count, frames
                  FROM queen.segments
                 WHERE partition_id = x.partition_id
                   AND base_offset <= x.msg_offset
                 ORDER BY base_offset DESC
                 LIMIT 1
           ) s ON s.base_offset + s.msg_count > x.msg_offset",
    )
    .bind(&pids)
    .bind(&offsets)
    .fetch_all(conn)
    .await?;
    let mut found = HashMap::with_capacity(rows.len());
    for (pid, offset, base, _count, bytes) in rows {
        let original = match (base, bytes) {
            (Some(base), Some(bytes)) => {
                let decoded =
                    frames::decode(&bytes).map_err(|source| StorageError::CorruptSegment {
                        partition: pid,
                        source,
                    })?;
                match decoded.get((offset - base) as usize) {
                    Some(frame) => Original::Found {
                        id: frame.id,
                        transaction_id: frame.transaction_id.to_string(),
                    },
                    None => Original::Gone,
                }
            }
            _ => Original::Gone,
        };
        found.insert((pid, offset), original);
    }
    Ok(found)
}

/// Deletes up to `limit` sidecar rows older than their queue's window (or of deleted
/// partitions); returns how many went. The bound on the smallest window lets the BRIN index
/// skip every block younger than that.
///
/// # Errors
///
/// Any database error.
pub async fn sweep_expired(conn: &mut PgConnection, limit: i64) -> Result<u64, StorageError> {
    let done = sqlx::query(
        "DELETE FROM queen.dedup_keys
          WHERE ctid = ANY (ARRAY(
                SELECT d.ctid
                  FROM queen.dedup_keys d
                  LEFT JOIN queen.partitions p ON p.id = d.partition_id
                  LEFT JOIN queen.queues q ON q.id = p.queue_id
                 WHERE d.created_at < now() - make_interval(secs => (
                           SELECT COALESCE(min(dedup_window_seconds), 0)
                             FROM queen.queues
                            WHERE dedup_window_seconds > 0))
                   AND (q.id IS NULL
                        OR d.created_at < now() - make_interval(secs => q.dedup_window_seconds))
                 LIMIT $1))",
    )
    .bind(limit)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Sweeps expired sidecar rows in batches until none are left (a background task).
pub async fn sweep_loop(pool: sqlx::PgPool, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let mut total = 0u64;
        loop {
            let batch = match pool.acquire().await {
                Ok(mut conn) => sweep_expired(&mut conn, 5_000).await,
                Err(e) => Err(e.into()),
            };
            match batch {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) => {
                    tracing::warn!(error = %e, "dedup sweep failed; retrying at the next interval");
                    break;
                }
            }
        }
        if total > 0 {
            tracing::debug!(rows = total, "swept expired dedup keys");
        }
    }
}
