//! How long a pop's lease lasts: the queue's `lease_time` (0 means 60 s), or the pop's own
//! `leaseSeconds` (reference §2.8, docs/consuming-2x.md).
//!
//! A pop that names `leaseSeconds` is claimed like any other (every claim path sets the queue's
//! length) and then has its lease set to the length it asked for, in one more statement: only
//! pops that carry the parameter pay for it (the 2.x SDK never sends it), and the claim
//! statements of the hot path stay as they are. Between the two statements the lease is live
//! with the queue's length, so nobody else can take it meanwhile.

use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// The longest lease a pop may ask for: one day, as a lease extend.
pub const MAX_LEASE_SECONDS: i32 = 86_400;

/// The lease length of a queue whose `lease_time` is `lease_time`: 0 means 60 s.
pub fn of_queue(lease_time: i32) -> i32 {
    if lease_time > 0 {
        lease_time
    } else {
        60
    }
}

/// Sets every live lease with the id `lease` (one per partition the pop claimed) to end
/// `seconds` from now; returns how many partitions it holds.
///
/// # Errors
///
/// Any database error.
pub async fn set(conn: &mut PgConnection, lease: Uuid, seconds: i32) -> Result<u64, StorageError> {
    Ok(sqlx::query(
        "UPDATE queen.partition_consumers
            SET lease_expires_at = now() + $2 * interval '1 second'
          WHERE lease_id = $1
            AND lease_expires_at > now()",
    )
    .bind(lease)
    .bind(seconds)
    .execute(conn)
    .await?
    .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_without_a_lease_time_leases_for_a_minute() {
        assert_eq!(of_queue(0), 60);
        assert_eq!(of_queue(-1), 60);
        assert_eq!(of_queue(5), 5);
    }
}
