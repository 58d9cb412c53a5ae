//! The Kafka brokers on this database and who coordinates each consumer group
//! (`queen.kafka_brokers`, `queen.kafka_coordinators`; migration 0017): a broker registers under
//! a node id with the address clients reach it at, each group's coordinator is the broker
//! holding the group's lease, and every lease is set and compared on PostgreSQL's clock, so
//! brokers whose clocks disagree still never both hold a group.
//!
//! Never decides anything about the Kafka protocol: `crate::kafka::cluster` decides when to
//! claim, renew and give up.

use std::time::Duration;

use sqlx::PgConnection;

use crate::storage::error::StorageError;

/// A Kafka broker as the cluster lists it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BrokerRow {
    /// Its node id (unique on this database).
    pub node_id: i32,
    /// The host clients reach it at.
    pub host: String,
    /// The port clients reach it at.
    pub port: i32,
}

/// What registering a broker gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// Its node id.
    pub node_id: i32,
    /// Whether the id is the one an earlier broker at the same address had (its lease had run
    /// out: a restart), rather than a new one.
    pub reused: bool,
    /// Other brokers at the same address whose lease still runs (a restart within the lease,
    /// or two brokers advertising one address: a misconfiguration).
    pub same_address: i64,
}

/// Who coordinates a group after a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The claiming broker: it took the group or held it already; the lease now runs from now.
    Held,
    /// Another broker, whose lease still runs.
    Other(BrokerRow),
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Registers a broker at `host:port` with a lease of `lease`: it takes the node id of an earlier
/// broker at the same address whose lease ran out (so a restarted broker keeps its id), or a
/// new one from `queen.kafka_node_ids`.
///
/// # Errors
///
/// Any database error.
pub async fn register_broker(
    conn: &mut PgConnection,
    host: &str,
    port: i32,
    lease: Duration,
) -> Result<Registered, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let earlier: Option<i32> = sqlx::query_scalar(
        "SELECT node_id FROM queen.kafka_brokers
          WHERE host = $1 AND port = $2 AND lease_until < now()
          ORDER BY node_id
          LIMIT 1
          FOR UPDATE SKIP LOCKED",
    )
    .bind(host)
    .bind(port)
    .fetch_optional(&mut *tx)
    .await?;
    let node_id: i32 = match earlier {
        Some(id) => {
            sqlx::query(
                "UPDATE queen.kafka_brokers
                    SET started_at = now(),
                        lease_until = now() + $2 * interval '1 millisecond'
                  WHERE node_id = $1",
            )
            .bind(id)
            .bind(millis(lease))
            .execute(&mut *tx)
            .await?;
            id
        }
        None => {
            sqlx::query_scalar(
                "INSERT INTO queen.kafka_brokers (node_id, host, port, lease_until)
                 VALUES (nextval('queen.kafka_node_ids'), $1, $2,
                         now() + $3 * interval '1 millisecond')
                 RETURNING node_id",
            )
            .bind(host)
            .bind(port)
            .bind(millis(lease))
            .fetch_one(&mut *tx)
            .await?
        }
    };
    let same_address: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM queen.kafka_brokers
          WHERE host = $1 AND port = $2 AND node_id <> $3 AND lease_until > now()",
    )
    .bind(host)
    .bind(port)
    .bind(node_id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Registered {
        node_id,
        reused: earlier.is_some(),
        same_address,
    })
}

/// Renews broker `node_id`'s lease; `false` when its row is gone (released, or forgotten after
/// a long outage: [`reinstate_broker`] puts it back).
///
/// # Errors
///
/// Any database error.
pub async fn renew_broker(
    conn: &mut PgConnection,
    node_id: i32,
    lease: Duration,
) -> Result<bool, StorageError> {
    let renewed = sqlx::query(
        "UPDATE queen.kafka_brokers
            SET lease_until = now() + $2 * interval '1 millisecond'
          WHERE node_id = $1",
    )
    .bind(node_id)
    .bind(millis(lease))
    .execute(conn)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Puts broker `node_id`'s row back (same id, same address) with a fresh lease.
///
/// # Errors
///
/// Any database error.
pub async fn reinstate_broker(
    conn: &mut PgConnection,
    node_id: i32,
    host: &str,
    port: i32,
    lease: Duration,
) -> Result<(), StorageError> {
    sqlx::query(
        "INSERT INTO queen.kafka_brokers (node_id, host, port, lease_until)
         VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
         ON CONFLICT (node_id) DO UPDATE
            SET host = EXCLUDED.host, port = EXCLUDED.port, lease_until = EXCLUDED.lease_until",
    )
    .bind(node_id)
    .bind(host)
    .bind(port)
    .bind(millis(lease))
    .execute(conn)
    .await?;
    Ok(())
}

/// The brokers whose lease runs, by node id.
///
/// # Errors
///
/// Any database error.
pub async fn alive_brokers(conn: &mut PgConnection) -> Result<Vec<BrokerRow>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT node_id, host, port FROM queen.kafka_brokers
          WHERE lease_until > now()
          ORDER BY node_id",
    )
    .fetch_all(conn)
    .await?)
}

/// Removes broker `node_id` (a clean stop): its groups go with it, so other brokers take them
/// at once instead of after the lease.
///
/// # Errors
///
/// Any database error.
pub async fn release_broker(conn: &mut PgConnection, node_id: i32) -> Result<(), StorageError> {
    sqlx::query("DELETE FROM queen.kafka_brokers WHERE node_id = $1")
        .bind(node_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Claims `group` for broker `node_id` with a lease of `lease` when nobody holds it, its lease
/// ran out, or `node_id` holds it already (then the lease is renewed); otherwise answers the
/// broker that holds it. `None` when the holder vanished between the two statements twice.
///
/// # Errors
///
/// Any database error (a claim by a broker whose own row is gone fails on the foreign key).
pub async fn claim_group(
    conn: &mut PgConnection,
    group: &str,
    node_id: i32,
    lease: Duration,
) -> Result<Option<Claim>, StorageError> {
    for _ in 0..2 {
        let claimed: Option<i32> = sqlx::query_scalar(
            "INSERT INTO queen.kafka_coordinators AS c (group_id, node_id, lease_until)
             VALUES ($1, $2, now() + $3 * interval '1 millisecond')
             ON CONFLICT (group_id) DO UPDATE
                SET claimed_at = CASE WHEN c.node_id = EXCLUDED.node_id
                                      THEN c.claimed_at ELSE now() END,
                    node_id = EXCLUDED.node_id,
                    lease_until = EXCLUDED.lease_until
              WHERE c.node_id = EXCLUDED.node_id OR c.lease_until <= now()
             RETURNING c.node_id",
        )
        .bind(group)
        .bind(node_id)
        .bind(millis(lease))
        .fetch_optional(&mut *conn)
        .await?;
        if claimed.is_some() {
            return Ok(Some(Claim::Held));
        }
        // Held by another broker: read it with a fresh snapshot (the claim's may predate it).
        let holder: Option<BrokerRow> = sqlx::query_as(
            "SELECT b.node_id, b.host, b.port
               FROM queen.kafka_coordinators c
               JOIN queen.kafka_brokers b ON b.node_id = c.node_id
              WHERE c.group_id = $1",
        )
        .bind(group)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(holder) = holder {
            return Ok(Some(if holder.node_id == node_id {
                Claim::Held
            } else {
                Claim::Other(holder)
            }));
        }
    }
    Ok(None)
}

/// Renews broker `node_id`'s lease on each of `groups` it still holds; answers those renewed
/// (a group missing from the answer is held by another broker now, or by nobody).
///
/// # Errors
///
/// Any database error.
pub async fn renew_groups(
    conn: &mut PgConnection,
    node_id: i32,
    groups: &[String],
    lease: Duration,
) -> Result<Vec<String>, StorageError> {
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar(
        "UPDATE queen.kafka_coordinators
            SET lease_until = now() + $3 * interval '1 millisecond'
          WHERE node_id = $1 AND group_id = ANY($2)
         RETURNING group_id",
    )
    .bind(node_id)
    .bind(groups)
    .bind(millis(lease))
    .fetch_all(conn)
    .await?)
}

/// Deletes the brokers and group leases that ran out more than `after` ago (with a broker go
/// the leases it still had); answers how many rows went.
///
/// # Errors
///
/// Any database error.
pub async fn forget_expired(conn: &mut PgConnection, after: Duration) -> Result<u64, StorageError> {
    let groups = sqlx::query(
        "DELETE FROM queen.kafka_coordinators
          WHERE lease_until < now() - $1 * interval '1 millisecond'",
    )
    .bind(millis(after))
    .execute(&mut *conn)
    .await?;
    let brokers = sqlx::query(
        "DELETE FROM queen.kafka_brokers
          WHERE lease_until < now() - $1 * interval '1 millisecond'",
    )
    .bind(millis(after))
    .execute(&mut *conn)
    .await?;
    Ok(groups.rows_affected() + brokers.rows_affected())
}
