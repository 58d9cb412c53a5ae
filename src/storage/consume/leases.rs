//! Leases: extending them, and checking that a named lease is live.
//!
//! A lease is the (partition, group) row's `lease_id` while `lease_expires_at` is in the
//! future; a multi-partition pop gives the same id to every partition it claimed. Claiming and
//! releasing happen in `consume` (pop) and `acks`.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// Why a lease could not be extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtendError {
    /// No partition was ever leased under this id (or it was reused by a later pop).
    NotFound,
    /// The lease ran out.
    Expired,
    /// The lease was released (its batch was acked or failed).
    NotActive,
}

impl ExtendError {
    /// The protocol's text.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NotFound => "Lease not found",
            Self::Expired => "Lease already expired",
            Self::NotActive => "Lease not active",
        }
    }
}

/// A renewed lease: how many partitions it covers and its latest new expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extended {
    /// Partitions whose lease was extended (a multi-partition pop shares one lease id).
    pub partitions: i64,
    /// The latest new expiry.
    pub expires_at: DateTime<Utc>,
}

/// Extends every live lease with this id to `max(current expiry, now + seconds)`.
///
/// # Errors
///
/// The outer error is a database error; the inner says why nothing was extended.
pub async fn extend(
    conn: &mut PgConnection,
    lease_id: Uuid,
    seconds: i64,
) -> Result<Result<Extended, ExtendError>, StorageError> {
    let (partitions, latest): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "WITH extended AS (
             UPDATE queen.partition_consumers
                SET lease_expires_at = GREATEST(lease_expires_at, now() + $2 * interval '1 second')
              WHERE lease_id = $1 AND lease_expires_at > now()
          RETURNING lease_expires_at
         )
         SELECT count(*), max(lease_expires_at) FROM extended",
    )
    .bind(lease_id)
    .bind(seconds as f64)
    .fetch_one(&mut *conn)
    .await?;
    if let Some(expires_at) = latest {
        return Ok(Ok(Extended {
            partitions,
            expires_at,
        }));
    }
    let state: Option<Option<DateTime<Utc>>> = sqlx::query_scalar(
        "SELECT max(lease_expires_at) FROM queen.partition_consumers WHERE lease_id = $1
         HAVING count(*) > 0",
    )
    .bind(lease_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(Err(match state {
        None => ExtendError::NotFound,
        Some(None) => ExtendError::NotActive,
        Some(Some(_)) => ExtendError::Expired,
    }))
}

/// The leases among `ids` that are not live on any partition.
///
/// # Errors
///
/// Any database error.
pub async fn not_live(conn: &mut PgConnection, ids: &[Uuid]) -> Result<Vec<Uuid>, StorageError> {
    sqlx::query_scalar(
        "SELECT x.id
           FROM unnest($1::uuid[]) AS x(id)
          WHERE NOT EXISTS (SELECT 1
                              FROM queen.partition_consumers c
                             WHERE c.lease_id = x.id
                               AND c.lease_expires_at > now())",
    )
    .bind(ids)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}
