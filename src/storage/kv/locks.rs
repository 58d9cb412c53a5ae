//! Locks and semaphores as KV rows: a permit is the row `<name>#<slot>` of the namespace
//! [`LOCKS_NAMESPACE`], its value `{"owner", "since"}`, its version the fencing token.
//!
//! Every op runs in a transaction of its own and first takes an advisory lock on the NAME, so
//! the ops on one name (acquire, renew, release, from any broker) take turns: a semaphore never
//! grants more slots than its limit. The op then takes the KV key lock of the slot it writes
//! (the one a `check` guard takes too), so a guard in a transaction and a renew of its permit
//! never interleave.
//!
//! Authority (the reference leaves some of it open; `docs/kv.md` says the same):
//! - acquire by an owner that already holds a live permit of the name answers that permit
//!   (`already`), unchanged;
//! - renew succeeds when the live row's token is the one sent and no other owner is named, or
//!   when the row's owner is the one named and the token sent is not above the row's (an answer
//!   that was lost); anything else is `lost`;
//! - release (which names no owner) needs the row's current token exactly;
//! - without `slot`, renew and release look for the slot by token (and owner).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgConnection;

use crate::storage::error::StorageError;
use crate::storage::kv::{
    fnv, key_lock, lock_all, read, remove, write, Expiry, RowTuple, LOCKS_NAMESPACE,
};

/// One lock op (validated by `protocol::kv`).
#[derive(Debug, Clone)]
pub enum LockOp {
    /// Take a permit.
    Acquire {
        /// Lock name (no `#`).
        name: String,
        /// Lifetime.
        ttl_seconds: i64,
        /// The holder's identity.
        owner: String,
        /// Permits of the name (1: a lock).
        limit: u32,
    },
    /// Extend a permit under a new token.
    Renew {
        /// Lock name.
        name: String,
        /// The token the caller holds.
        token: i64,
        /// New lifetime.
        ttl_seconds: i64,
        /// The slot, when known.
        slot: Option<u32>,
        /// The holder's identity, when given.
        owner: Option<String>,
    },
    /// Give a permit back.
    Release {
        /// Lock name.
        name: String,
        /// The current token.
        token: i64,
        /// The slot, when known.
        slot: Option<u32>,
    },
    /// Who holds the name.
    Get {
        /// Lock name.
        name: String,
    },
}

/// One live permit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Slot (0 for a lock).
    pub slot: u32,
    /// Owner.
    pub owner: String,
    /// Token (the row's version).
    pub token: i64,
    /// When this holder took it (as stored in the row).
    pub since: Option<String>,
    /// When it dies.
    pub expires_at: Option<DateTime<Utc>>,
    /// Its last write.
    pub renewed_at: DateTime<Utc>,
}

/// What a lock op answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    /// A permit is the caller's.
    Acquired {
        /// Slot.
        slot: u32,
        /// Token.
        token: i64,
        /// Owner.
        owner: String,
        /// The owner held it already (same token, nothing written).
        already: bool,
    },
    /// Every permit is held.
    Held {
        /// The holders.
        holders: Vec<Holder>,
    },
    /// Renewed under a new token.
    Renewed {
        /// Slot.
        slot: u32,
        /// New token.
        token: i64,
    },
    /// The permit is not the caller's any more.
    Lost {
        /// The holders now.
        holders: Vec<Holder>,
    },
    /// Released (or not: the token was not the row's).
    Released(bool),
    /// The holders.
    Holders(Vec<Holder>),
}

/// The KV key of a permit.
pub fn permit_key(name: &str, slot: u32) -> String {
    format!("{name}#{slot}")
}

/// Runs one op in a transaction of its own.
///
/// # Errors
///
/// Any database error (nothing applied).
pub async fn apply(conn: &mut PgConnection, op: &LockOp) -> Result<LockOutcome, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let name = match op {
        LockOp::Acquire { name, .. }
        | LockOp::Renew { name, .. }
        | LockOp::Release { name, .. }
        | LockOp::Get { name } => name,
    };
    lock_all(&mut tx, &mut vec![fnv(&[b"lock", name.as_bytes()])]).await?;
    let holders = holders(&mut tx, name).await?;
    let outcome = match op {
        LockOp::Acquire {
            name,
            ttl_seconds,
            owner,
            limit,
        } => {
            if let Some(mine) = holders.iter().find(|h| &h.owner == owner) {
                LockOutcome::Acquired {
                    slot: mine.slot,
                    token: mine.token,
                    owner: owner.clone(),
                    already: true,
                }
            } else if let Some(slot) = (0..*limit).find(|s| holders.iter().all(|h| h.slot != *s)) {
                let key = permit_key(name, slot);
                lock_key(&mut tx, &key).await?;
                let value = json!({ "owner": owner, "since": now_text() }).to_string();
                let (token, _) = write(
                    &mut tx,
                    LOCKS_NAMESPACE,
                    &key,
                    &value,
                    Some(Expiry::Ttl(*ttl_seconds)),
                )
                .await?;
                LockOutcome::Acquired {
                    slot,
                    token,
                    owner: owner.clone(),
                    already: false,
                }
            } else {
                LockOutcome::Held { holders }
            }
        }
        LockOp::Renew {
            name,
            token,
            ttl_seconds,
            slot,
            owner,
        } => {
            let mine = holders.iter().find(|h| {
                slot.is_none_or(|s| s == h.slot)
                    && match owner {
                        Some(o) => &h.owner == o && *token <= h.token,
                        None => h.token == *token,
                    }
            });
            match mine {
                Some(h) => {
                    let key = permit_key(name, h.slot);
                    lock_key(&mut tx, &key).await?;
                    let row = read(&mut tx, LOCKS_NAMESPACE, &key).await?;
                    let value =
                        row.map_or_else(|| json!({ "owner": h.owner }).to_string(), |r| r.value);
                    let (token, _) = write(
                        &mut tx,
                        LOCKS_NAMESPACE,
                        &key,
                        &value,
                        Some(Expiry::Ttl(*ttl_seconds)),
                    )
                    .await?;
                    LockOutcome::Renewed {
                        slot: h.slot,
                        token,
                    }
                }
                None => LockOutcome::Lost { holders },
            }
        }
        LockOp::Release { name, token, slot } => {
            match holders
                .iter()
                .find(|h| h.token == *token && slot.is_none_or(|s| s == h.slot))
            {
                Some(h) => {
                    let key = permit_key(name, h.slot);
                    lock_key(&mut tx, &key).await?;
                    remove(&mut tx, LOCKS_NAMESPACE, &key).await?;
                    LockOutcome::Released(true)
                }
                None => LockOutcome::Released(false),
            }
        }
        LockOp::Get { .. } => LockOutcome::Holders(holders),
    };
    tx.commit().await?;
    Ok(outcome)
}

async fn lock_key(conn: &mut PgConnection, key: &str) -> Result<(), StorageError> {
    lock_all(conn, &mut vec![key_lock(LOCKS_NAMESPACE, key)]).await
}

/// The wall clock as the permit's `since` (milliseconds, UTC).
fn now_text() -> String {
    Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// The live permits of `name`, by slot.
async fn holders(conn: &mut PgConnection, name: &str) -> Result<Vec<Holder>, StorageError> {
    // `<name>#…` is the key range [`<name>#`, `<name>$`) in byte order ('$' follows '#').
    let rows: Vec<RowTuple> = sqlx::query_as(
        "SELECT key, value, version, expires_at, updated_at
           FROM queen.kv
          WHERE namespace = $1
            AND key >= $2
            AND key < $3
            AND (expires_at IS NULL OR expires_at > statement_timestamp())
          ORDER BY key",
    )
    .bind(LOCKS_NAMESPACE)
    .bind(format!("{name}#"))
    .bind(format!("{name}$"))
    .fetch_all(&mut *conn)
    .await?;
    let mut out: Vec<Holder> = rows
        .into_iter()
        .filter_map(|(key, value, version, expires_at, updated_at)| {
            let slot: u32 = key.strip_prefix(name)?.strip_prefix('#')?.parse().ok()?;
            let value: serde_json::Value = serde_json::from_str(&value).ok()?;
            Some(Holder {
                slot,
                owner: value.get("owner")?.as_str()?.to_string(),
                token: version,
                since: value
                    .get("since")
                    .and_then(|s| s.as_str())
                    .map(str::to_string),
                expires_at,
                renewed_at: updated_at,
            })
        })
        .collect();
    out.sort_by_key(|h| h.slot);
    Ok(out)
}
