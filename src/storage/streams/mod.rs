//! The streams runtime's tables (reference 2.x §2.11, `docs/streams.md`): registered queries
//! ([`register`]), state rows per (query, source partition) ([`get_state`]) and the atomic
//! cycle ([`cycle`]).
//!
//! Tables (migration 0015): `stream_queries` (one row per query name), `stream_shards` (one row
//! per (query, partition): the cycle's lock and the running size of its state) and
//! `stream_state` (the rows; `value` as received, `window_end` extracted for the ripe read).
//!
//! Lock order, the same everywhere so nothing deadlocks: the query row (only registers lock
//! it), then the query's advisory lock ([`QUERY_LOCK`]: every cycle takes it shared, a reset
//! exclusive), then shard rows, then what the commit path and the ack path lock (partition rows,
//! then (partition, group) rows). So a reset waits for the query's running cycles and the
//! cycles arriving meanwhile wait for the reset's COMMIT: a cycle is wholly before or wholly
//! after a reset. A shared advisory lock lives in the lock table only, so cycles of many
//! partitions of one query never write to a common row.
//!
//! Knows nothing about HTTP or JSON bodies: the protocol layer parses requests into the types
//! here, and the HTTP layer writes the outcomes out.

pub mod cycle;

/// Namespace (first key) of the advisory locks of queries; the second key is
/// `hashtext(query_id::text)` (a collision only serialises two queries' resets and cycles).
pub const QUERY_LOCK: i32 = 0x5153_5452; // "QSTR"

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;
use crate::storage::kv::prefix_end;

/// A registration request (`POST /streams/v1/queries`).
#[derive(Debug, Clone)]
pub struct Registration {
    /// The user's query name (the SDK's `query_id`).
    pub name: String,
    /// The source queue's name.
    pub source_queue: String,
    /// The sink queue's name, when the stream has one.
    pub sink_queue: Option<String>,
    /// The SDK's hash of the operator chain (opaque).
    pub config_hash: String,
    /// Wipe the query's state when the hash changed.
    pub reset: bool,
}

/// What a registration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// The query is (now) registered under `id` with the request's hash.
    Ok {
        /// The server's id of the query.
        id: Uuid,
        /// The name was new.
        fresh: bool,
        /// The hash changed and the query's state was wiped.
        reset: bool,
    },
    /// The stored hash differs and the request did not ask for a reset: nothing changed.
    HashMismatch {
        /// The server's id of the query.
        id: Uuid,
        /// The hash stored for it.
        stored: String,
    },
}

/// Registers a query by name, idempotently: a new name is inserted; the same hash updates
/// the source and sink; a different hash with `reset` deletes every state row and shard of the
/// query and stores the new hash; a different hash without `reset` changes nothing.
///
/// # Errors
///
/// Any database error.
pub async fn register(
    conn: &mut PgConnection,
    reg: &Registration,
) -> Result<Registered, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO queen.stream_queries (id, name, source_queue, sink_queue, config_hash)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (name) DO NOTHING
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(&reg.name)
    .bind(&reg.source_queue)
    .bind(&reg.sink_queue)
    .bind(&reg.config_hash)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(id) = inserted {
        tx.commit().await?;
        return Ok(Registered::Ok {
            id,
            fresh: true,
            reset: false,
        });
    }
    // The name exists (ON CONFLICT waited for a concurrent insert to commit); FOR UPDATE
    // orders concurrent registers of it.
    let (id, stored): (Uuid, String) = sqlx::query_as(
        "SELECT id, config_hash
           FROM queen.stream_queries
          WHERE name = $1
            FOR UPDATE",
    )
    .bind(&reg.name)
    .fetch_one(&mut *tx)
    .await?;
    let changed = stored != reg.config_hash;
    if changed && !reg.reset {
        return Ok(Registered::HashMismatch { id, stored });
    }
    if changed {
        // Exclusive: waits for the query's running cycles, holds new ones until COMMIT.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2::text))")
            .bind(QUERY_LOCK)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM queen.stream_shards WHERE query_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM queen.stream_state WHERE query_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "UPDATE queen.stream_queries
            SET source_queue = $2,
                sink_queue = $3,
                config_hash = $4,
                updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(&reg.source_queue)
    .bind(&reg.sink_queue)
    .bind(&reg.config_hash)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Registered::Ok {
        id,
        fresh: false,
        reset: changed,
    })
}

/// Whether a query with this id is registered.
///
/// # Errors
///
/// Any database error.
pub async fn query_exists(conn: &mut PgConnection, id: Uuid) -> Result<bool, StorageError> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM queen.stream_queries WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    Ok(found.is_some())
}

/// A state read (`POST /streams/v1/state/get`): the filters are ANDed.
#[derive(Debug, Clone, Default)]
pub struct StateQuery {
    /// The query's server id.
    pub query_id: Uuid,
    /// The source partition's public id.
    pub partition_id: Uuid,
    /// The partition's 64-bit id when the body named it so (decimal text, as a framed pop
    /// gives it); resolved to `partition_id` before the state is read.
    pub partition_number: Option<i64>,
    /// Only these keys (empty: every key).
    pub keys: Vec<String>,
    /// Only keys starting with this (empty: every key).
    pub key_prefix: String,
    /// Only rows whose `value.windowEnd` is a number at or before this (epoch ms).
    pub ripe_at_or_before: Option<f64>,
}

/// One state row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StateRow {
    /// Its key.
    pub key: String,
    /// Its JSON value, exactly as written.
    pub value: String,
    /// When a cycle last wrote it.
    pub updated_at: DateTime<Utc>,
}

/// The ripe-window read: the rows of one (query, partition) whose `windowEnd` is at or before
/// `$3`, optionally inside the key range `$4 ..< $5`. One range scan of the partial index
/// `stream_state_ripe`, however many other keys the partition holds (a test EXPLAINs it).
pub const RIPE_SQL: &str = "SELECT key, value, updated_at
   FROM queen.stream_state
  WHERE query_id = $1
    AND partition_id = $2
    AND window_end <= $3
    AND ($4::text IS NULL OR key >= $4)
    AND ($5::text IS NULL OR key < $5)
  ORDER BY key";

/// The rows of a [`StateQuery`], sorted by key (bytewise). Missing keys are simply absent.
///
/// # Errors
///
/// Any database error.
pub async fn get_state(
    conn: &mut PgConnection,
    q: &StateQuery,
) -> Result<Vec<StateRow>, StorageError> {
    let prefix = (!q.key_prefix.is_empty()).then_some(q.key_prefix.as_str());
    let end = prefix.and_then(prefix_end);
    let mut rows: Vec<StateRow> = if let Some(ripe) = q.ripe_at_or_before {
        sqlx::query_as(RIPE_SQL)
            .bind(q.query_id)
            .bind(q.partition_id)
            .bind(ripe)
            .bind(prefix)
            .bind(end.as_deref())
            .fetch_all(&mut *conn)
            .await?
    } else if !q.keys.is_empty() {
        sqlx::query_as(
            "SELECT key, value, updated_at
               FROM queen.stream_state
              WHERE query_id = $1
                AND partition_id = $2
                AND key = ANY($3)
              ORDER BY key",
        )
        .bind(q.query_id)
        .bind(q.partition_id)
        .bind(&q.keys)
        .fetch_all(&mut *conn)
        .await?
    } else if let (Some(prefix), Some(end)) = (prefix, end.as_deref()) {
        // One key range of the primary key.
        sqlx::query_as(
            "SELECT key, value, updated_at
               FROM queen.stream_state
              WHERE query_id = $1
                AND partition_id = $2
                AND key >= $3
                AND key < $4
              ORDER BY key",
        )
        .bind(q.query_id)
        .bind(q.partition_id)
        .bind(prefix)
        .bind(end)
        .fetch_all(&mut *conn)
        .await?
    } else {
        // Every key (a prefix with no string above it is filtered below).
        sqlx::query_as(
            "SELECT key, value, updated_at
               FROM queen.stream_state
              WHERE query_id = $1
                AND partition_id = $2
              ORDER BY key",
        )
        .bind(q.query_id)
        .bind(q.partition_id)
        .fetch_all(&mut *conn)
        .await?
    };
    // The filters the chosen statement did not apply.
    if !q.keys.is_empty() {
        let wanted: std::collections::HashSet<&str> = q.keys.iter().map(String::as_str).collect();
        rows.retain(|r| wanted.contains(r.key.as_str()));
    }
    if let Some(prefix) = prefix {
        rows.retain(|r| r.key.starts_with(prefix));
    }
    Ok(rows)
}
