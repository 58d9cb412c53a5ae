//! The key/value store (`queen.kv`): the ops of `POST /api/v1/kv` and of a transaction's `kv`
//! rider, applied in order inside the caller's database transaction.
//!
//! - [`apply_ops`] runs a list of [`Op`]s on a connection that is already in a transaction;
//!   [`run_batch`] opens one, runs them and commits (or rolls back when a `required` op lost).
//! - [`locks`]: locks and semaphores as rows of the namespace [`LOCKS_NAMESPACE`].
//! - [`sweep`]: the background task that deletes rows that expired a while ago.
//!
//! Rules every statement here keeps:
//! - **Expiry is a predicate.** A row whose `expires_at` is past is absent for every op, swept
//!   or not (`statement_timestamp()`, the database's clock, is the one clock).
//! - **Versions come from one sequence** (`queen.kv_versions`): every write takes a new one, so
//!   a key's version rises strictly across deletes, expiry and brokers.
//! - **Writers of one key take turns**: before any op runs, the batch takes a
//!   transaction-scoped advisory lock per key it writes or checks (plain reads take none), all at once in ascending hash order (so
//!   two batches naming the same keys in another order never deadlock). The lock is held to
//!   commit, so a `check` in a transaction keeps its key unchanged until the transaction ends.
//!
//! Knows nothing about JSON requests or HTTP: `protocol::kv` parses ops and renders outcomes.
//! Never writes into [`LOCKS_NAMESPACE`] from a plain op (the protocol refuses that; [`locks`]
//! is the only writer there).

pub mod locks;
pub mod sweep;

use chrono::{DateTime, Utc};
use serde_json::Number;
use sqlx::PgConnection;

use crate::storage::error::StorageError;

/// The namespace that holds lock and semaphore permits (written only by [`locks`]).
pub const LOCKS_NAMESPACE: &str = "queen-locks";

/// Bytes of values a `getMany` or `getPrefix` answers at most (at least one row is always
/// answered); rows past it are left out and the answer says `truncated`.
pub const READ_BUDGET_BYTES: usize = 4 * 1024 * 1024;

/// When a written key dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// This many seconds after the write.
    Ttl(i64),
    /// Never.
    Forever,
}

impl Expiry {
    fn seconds(self) -> Option<i64> {
        match self {
            Self::Ttl(s) => Some(s),
            Self::Forever => None,
        }
    }
}

/// One KV operation (already validated by `protocol::kv`).
#[derive(Debug, Clone)]
pub enum Op {
    /// One key.
    Get {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
    },
    /// Several keys of one namespace.
    GetMany {
        /// Namespace.
        ns: String,
        /// Keys, in the order the answer's `missing` keeps.
        keys: Vec<String>,
    },
    /// One page of the keys that start with `prefix`, after `after`, in code-point order.
    GetPrefix {
        /// Namespace.
        ns: String,
        /// Literal prefix (not a pattern).
        prefix: String,
        /// Keyset cursor: only keys greater than this.
        after: Option<String>,
        /// Rows per page (already clamped).
        limit: usize,
        /// Leave values out.
        keys_only: bool,
    },
    /// Write a value (`putIfAbsent` is a put with `expect: Some(0)`).
    Put {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// The JSON value as received.
        value: String,
        /// When it dies.
        expiry: Expiry,
        /// `0`: must not exist; `N`: must be at version N.
        expect: Option<i64>,
        /// A lost precondition undoes the whole batch.
        required: bool,
    },
    /// Remove a key.
    Delete {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// `0`: must not exist (so never applies); `N`: must be at version N.
        expect: Option<i64>,
        /// A lost precondition undoes the whole batch.
        required: bool,
    },
    /// Add `delta` to a numeric value (absent: 0), refused when the result leaves `[min, max]`.
    Incr {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// Amount.
        delta: Number,
        /// Lowest admitted result.
        min: Option<Number>,
        /// Highest admitted result.
        max: Option<Number>,
        /// Expiry of a row this creates (a live row keeps its own).
        expiry: Expiry,
        /// A lost precondition undoes the whole batch.
        required: bool,
    },
    /// A precondition that writes nothing.
    Check {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// `0`: must not exist; `N`: must be at version N.
        expect: i64,
        /// A lost precondition undoes the whole batch.
        required: bool,
    },
}

impl Op {
    /// The (namespace, key) pairs this op must hold to commit: the keys it writes or checks.
    /// Plain reads take no lock (each statement reads committed rows).
    fn keys(&self) -> Vec<(&str, &str)> {
        match self {
            Self::Put { ns, key, .. }
            | Self::Delete { ns, key, .. }
            | Self::Incr { ns, key, .. }
            | Self::Check { ns, key, .. } => vec![(ns, key)],
            Self::Get { .. } | Self::GetMany { .. } | Self::GetPrefix { .. } => Vec::new(),
        }
    }

    /// Whether a lost precondition of this op undoes the batch.
    pub fn required(&self) -> bool {
        match self {
            Self::Put { required, .. }
            | Self::Delete { required, .. }
            | Self::Incr { required, .. }
            | Self::Check { required, .. } => *required,
            _ => false,
        }
    }
}

/// One stored, live row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Key.
    pub key: String,
    /// The JSON value as stored.
    pub value: String,
    /// Version (from `queen.kv_versions`).
    pub version: i64,
    /// When it dies (`None`: never).
    pub expires_at: Option<DateTime<Utc>>,
    /// Last write.
    pub updated_at: DateTime<Utc>,
}

/// Why a write or check did not apply (the protocol's closed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The key is at another version than `expect`.
    Version,
    /// The key does not exist (or expired).
    Absent,
    /// The key exists and was expected not to.
    Exists,
    /// An `incr` would leave `[min, max]`.
    Limit,
    /// An `incr` on a value that is not a number.
    Type,
}

impl Reason {
    /// The protocol's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Version => "version",
            Self::Absent => "absent",
            Self::Exists => "exists",
            Self::Limit => "limit",
            Self::Type => "type",
        }
    }
}

/// What one op answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `get`: the row, or `None`.
    Found(Option<Row>),
    /// `getMany`.
    Many {
        /// Live rows, in the order their keys were asked.
        rows: Vec<Row>,
        /// Keys with no live row.
        missing: Vec<String>,
        /// Some keys were left out by [`READ_BUDGET_BYTES`].
        truncated: bool,
    },
    /// `getPrefix`.
    Prefix {
        /// Rows in key order.
        rows: Vec<Row>,
        /// More rows follow.
        truncated: bool,
        /// Leave values out of the answer.
        keys_only: bool,
    },
    /// A write or check applied.
    Applied {
        /// The key's version now (a delete: the deleted row's; a check: the checked one).
        version: i64,
        /// The value now (put and incr).
        value: Option<String>,
        /// The row's expiry now (writes that keep a row).
        expires_at: Option<DateTime<Utc>>,
    },
    /// A write or check did not apply: the current value and version (0, `None` when absent).
    Refused {
        /// Why.
        reason: Reason,
        /// The current value.
        value: Option<String>,
        /// The current version.
        version: i64,
    },
}

/// What a batch did.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// One per op that ran, in order (all of them unless `failed`).
    pub results: Vec<Outcome>,
    /// The `required` op whose precondition lost: the batch must apply nothing (the caller
    /// rolls back), and ops after it did not run.
    pub failed: Option<usize>,
}

/// Runs `ops` in one transaction of its own: committed, or rolled back when a `required` op
/// lost. A batch of one read is one statement on its own (a statement sees one snapshot, it
/// takes no key lock and writes nothing): no `BEGIN` and `COMMIT` round trips around it.
///
/// # Errors
///
/// Any database error (nothing applied).
pub async fn run_batch(conn: &mut PgConnection, ops: &[Op]) -> Result<Batch, StorageError> {
    if let [op @ (Op::Get { .. } | Op::GetMany { .. } | Op::GetPrefix { .. })] = ops {
        return Ok(Batch {
            results: vec![apply_one(conn, op).await?],
            failed: None,
        });
    }
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let batch = apply_ops(&mut tx, ops).await?;
    if batch.failed.is_some() {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(batch)
}

/// Runs `ops` in order on `conn`, which must be inside a transaction (the key locks last until
/// it ends). Stops at the first `required` op whose precondition lost ([`Batch::failed`]);
/// the caller must then roll back.
///
/// # Errors
///
/// Any database error.
pub async fn apply_ops(conn: &mut PgConnection, ops: &[Op]) -> Result<Batch, StorageError> {
    let mut keys: Vec<i64> = ops
        .iter()
        .flat_map(|op| op.keys())
        .map(|(ns, key)| key_lock(ns, key))
        .collect();
    lock_all(conn, &mut keys).await?;
    let mut results = Vec::with_capacity(ops.len());
    for (n, op) in ops.iter().enumerate() {
        let outcome = apply_one(conn, op).await?;
        let lost = matches!(outcome, Outcome::Refused { .. }) && op.required();
        results.push(outcome);
        if lost {
            return Ok(Batch {
                results,
                failed: Some(n),
            });
        }
    }
    Ok(Batch {
        results,
        failed: None,
    })
}

/// The advisory-lock id of one key: FNV-1a (a fixed function, so every broker version agrees)
/// over a tag, the namespace and the key.
pub(crate) fn key_lock(ns: &str, key: &str) -> i64 {
    fnv(&[b"kv", ns.as_bytes(), key.as_bytes()])
}

/// FNV-1a 64 over `parts`, each followed by a 0 byte (text holds no NUL, so parts never run
/// together).
pub(crate) fn fnv(parts: &[&[u8]]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(std::iter::once(&0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h as i64
}

/// Takes the transaction-scoped advisory locks `ids` in ascending order (deduplicated).
pub(crate) async fn lock_all(
    conn: &mut PgConnection,
    ids: &mut Vec<i64>,
) -> Result<(), StorageError> {
    if ids.is_empty() {
        return Ok(());
    }
    ids.sort_unstable();
    ids.dedup();
    // unnest yields the array in order, so the locks are taken in that order.
    sqlx::query("SELECT count(pg_advisory_xact_lock(id)) FROM unnest($1::bigint[]) AS id")
        .bind(&*ids)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn apply_one(conn: &mut PgConnection, op: &Op) -> Result<Outcome, StorageError> {
    Ok(match op {
        Op::Get { ns, key } => Outcome::Found(read(conn, ns, key).await?),
        Op::GetMany { ns, keys } => get_many(conn, ns, keys).await?,
        Op::GetPrefix {
            ns,
            prefix,
            after,
            limit,
            keys_only,
        } => get_prefix(conn, ns, prefix, after.as_deref(), *limit, *keys_only).await?,
        Op::Check {
            ns, key, expect, ..
        } => {
            let row = read(conn, ns, key).await?;
            match judge(row.as_ref(), Some(*expect)) {
                Some(refused) => refused,
                None => Outcome::Applied {
                    version: row.as_ref().map_or(0, |r| r.version),
                    value: None,
                    expires_at: row.and_then(|r| r.expires_at),
                },
            }
        }
        Op::Put {
            ns,
            key,
            value,
            expiry,
            expect,
            ..
        } => {
            let row = read(conn, ns, key).await?;
            if let Some(refused) = judge(row.as_ref(), *expect) {
                return Ok(refused);
            }
            let (version, expires_at) = write(conn, ns, key, value, Some(*expiry)).await?;
            Outcome::Applied {
                version,
                value: Some(value.clone()),
                expires_at,
            }
        }
        Op::Delete {
            ns, key, expect, ..
        } => {
            let row = read(conn, ns, key).await?;
            if let Some(refused) = judge(row.as_ref(), *expect) {
                return Ok(refused);
            }
            let Some(row) = row else {
                return Ok(refused(None, Reason::Absent));
            };
            remove(conn, ns, key).await?;
            Outcome::Applied {
                version: row.version,
                value: None,
                expires_at: None,
            }
        }
        Op::Incr {
            ns,
            key,
            delta,
            min,
            max,
            expiry,
            ..
        } => {
            let row = read(conn, ns, key).await?;
            let current = match &row {
                None => Number::from(0),
                Some(r) => match serde_json::from_str::<Number>(&r.value) {
                    Ok(n) => n,
                    Err(_) => return Ok(refused(row.as_ref(), Reason::Type)),
                },
            };
            let Some(next) = add(&current, delta) else {
                return Ok(refused(row.as_ref(), Reason::Limit));
            };
            if below(&next, min.as_ref()) || above(&next, max.as_ref()) {
                return Ok(refused(row.as_ref(), Reason::Limit));
            }
            let text = next.to_string();
            // The TTL of an incr is create-only: a live row keeps its expiry.
            let expiry = if row.is_some() { None } else { Some(*expiry) };
            let (version, expires_at) = write(conn, ns, key, &text, expiry).await?;
            Outcome::Applied {
                version,
                value: Some(text),
                expires_at,
            }
        }
    })
}

/// The refusal `expect` earns against `row` (`None`: the precondition holds).
fn judge(row: Option<&Row>, expect: Option<i64>) -> Option<Outcome> {
    match (expect, row) {
        (None, _) => None,
        (Some(0), None) => None,
        (Some(0), Some(_)) => Some(refused(row, Reason::Exists)),
        (Some(_), None) => Some(refused(None, Reason::Absent)),
        (Some(v), Some(r)) if r.version == v => None,
        (Some(_), Some(_)) => Some(refused(row, Reason::Version)),
    }
}

fn refused(row: Option<&Row>, reason: Reason) -> Outcome {
    Outcome::Refused {
        reason,
        value: row.map(|r| r.value.clone()),
        version: row.map_or(0, |r| r.version),
    }
}

/// `a + b`, in integers when both are integers (`None` on overflow), else in floats (`None`
/// when not finite).
fn add(a: &Number, b: &Number) -> Option<Number> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x.checked_add(y).map(Number::from);
    }
    Number::from_f64(a.as_f64()? + b.as_f64()?)
}

fn compare(a: &Number, b: &Number) -> std::cmp::Ordering {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x.cmp(&y);
    }
    let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
    x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
}

fn below(n: &Number, min: Option<&Number>) -> bool {
    min.is_some_and(|m| compare(n, m).is_lt())
}

fn above(n: &Number, max: Option<&Number>) -> bool {
    max.is_some_and(|m| compare(n, m).is_gt())
}

pub(crate) type RowTuple = (String, String, i64, Option<DateTime<Utc>>, DateTime<Utc>);

fn row_of(t: RowTuple) -> Row {
    Row {
        key: t.0,
        value: t.1,
        version: t.2,
        expires_at: t.3,
        updated_at: t.4,
    }
}

/// The live row of (`ns`, `key`).
pub(crate) async fn read(
    conn: &mut PgConnection,
    ns: &str,
    key: &str,
) -> Result<Option<Row>, StorageError> {
    let row: Option<RowTuple> = sqlx::query_as(
        "SELECT key, value, version, expires_at, updated_at
           FROM queen.kv
          WHERE namespace = $1
            AND key = $2
            AND (expires_at IS NULL OR expires_at > statement_timestamp())",
    )
    .bind(ns)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(row_of))
}

/// Writes (`ns`, `key`) = `value` with a new version. `expiry`: the new expiry (`None`: keep
/// the row's). Returns the version and the expiry now.
pub(crate) async fn write(
    conn: &mut PgConnection,
    ns: &str,
    key: &str,
    value: &str,
    expiry: Option<Expiry>,
) -> Result<(i64, Option<DateTime<Utc>>), StorageError> {
    let keep = expiry.is_none();
    let seconds = expiry.and_then(Expiry::seconds);
    let done: (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "INSERT INTO queen.kv (namespace, key, value, version, expires_at, updated_at)
         VALUES ($1, $2, $3, nextval('queen.kv_versions'),
                 statement_timestamp() + $4::bigint * interval '1 second',
                 statement_timestamp())
         ON CONFLICT (namespace, key) DO UPDATE
            SET value = EXCLUDED.value,
                version = EXCLUDED.version,
                expires_at = CASE WHEN $5 THEN queen.kv.expires_at ELSE EXCLUDED.expires_at END,
                updated_at = EXCLUDED.updated_at
         RETURNING version, expires_at",
    )
    .bind(ns)
    .bind(key)
    .bind(value)
    .bind(seconds)
    .bind(keep)
    .fetch_one(&mut *conn)
    .await?;
    Ok(done)
}

/// Deletes (`ns`, `key`), live or not.
pub(crate) async fn remove(
    conn: &mut PgConnection,
    ns: &str,
    key: &str,
) -> Result<(), StorageError> {
    sqlx::query("DELETE FROM queen.kv WHERE namespace = $1 AND key = $2")
        .bind(ns)
        .bind(key)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn get_many(
    conn: &mut PgConnection,
    ns: &str,
    keys: &[String],
) -> Result<Outcome, StorageError> {
    let found: Vec<RowTuple> = sqlx::query_as(
        "SELECT key, value, version, expires_at, updated_at
           FROM queen.kv
          WHERE namespace = $1
            AND key = ANY($2)
            AND (expires_at IS NULL OR expires_at > statement_timestamp())",
    )
    .bind(ns)
    .bind(keys)
    .fetch_all(&mut *conn)
    .await?;
    let mut by_key: std::collections::HashMap<String, Row> = found
        .into_iter()
        .map(|t| (t.0.clone(), row_of(t)))
        .collect();
    let (mut rows, mut missing, mut bytes, mut truncated) = (Vec::new(), Vec::new(), 0, false);
    for key in keys {
        match by_key.remove(key) {
            Some(row) => {
                if !rows.is_empty() && bytes + row.value.len() > READ_BUDGET_BYTES {
                    truncated = true;
                    continue;
                }
                bytes += row.value.len();
                rows.push(row);
            }
            // A key asked twice is found once and not reported missing.
            None if !rows.iter().any(|r: &Row| &r.key == key) && !missing.contains(key) => {
                missing.push(key.clone());
            }
            None => {}
        }
    }
    Ok(Outcome::Many {
        rows,
        missing,
        truncated,
    })
}

/// The smallest string above every string that starts with `prefix`, in code-point order
/// (`None`: there is none). Code-point order is the byte order of UTF-8, which is what the
/// `COLLATE "C"` key column sorts by.
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        if (0xD800..=0xDFFF).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

async fn get_prefix(
    conn: &mut PgConnection,
    ns: &str,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    keys_only: bool,
) -> Result<Outcome, StorageError> {
    // A range of the primary key bounds the scan; starts_with() is the rule (no LIKE, so `%`
    // and `_` are plain characters).
    let found: Vec<RowTuple> = sqlx::query_as(
        "SELECT key, value, version, expires_at, updated_at
           FROM queen.kv
          WHERE namespace = $1
            AND key >= $2
            AND ($3::text IS NULL OR key > $3)
            AND ($4::text IS NULL OR key < $4)
            AND starts_with(key, $2)
            AND (expires_at IS NULL OR expires_at > statement_timestamp())
          ORDER BY key
          LIMIT $5",
    )
    .bind(ns)
    .bind(prefix)
    .bind(after)
    .bind(prefix_end(prefix))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1))
    .fetch_all(&mut *conn)
    .await?;
    let mut truncated = found.len() > limit;
    let mut rows = Vec::new();
    let mut bytes = 0;
    for t in found.into_iter().take(limit) {
        let size = if keys_only { t.0.len() } else { t.1.len() };
        if !rows.is_empty() && bytes + size > READ_BUDGET_BYTES {
            truncated = true;
            break;
        }
        bytes += size;
        rows.push(row_of(t));
    }
    Ok(Outcome::Prefix {
        rows,
        truncated,
        keys_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_code_point_string() {
        assert_eq!(prefix_end("walk:").as_deref(), Some("walk;"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
    }

    #[test]
    fn incr_arithmetic_stays_integral_and_refuses_overflow() {
        let n = |v: i64| Number::from(v);
        assert_eq!(add(&n(2), &n(3)), Some(n(5)));
        assert_eq!(add(&n(i64::MAX), &n(1)), None);
        assert!(above(&n(4), Some(&n(3))));
        assert!(!above(&n(3), Some(&n(3))));
        assert!(below(&n(-1), Some(&n(0))));
        let half = Number::from_f64(0.5).unwrap();
        assert_eq!(add(&n(1), &half), Number::from_f64(1.5));
    }

    #[test]
    fn expect_is_judged_against_the_live_row() {
        let row = Row {
            key: "k".into(),
            value: "1".into(),
            version: 7,
            expires_at: None,
            updated_at: Utc::now(),
        };
        assert!(judge(Some(&row), None).is_none());
        assert!(judge(Some(&row), Some(7)).is_none());
        assert!(judge(None, Some(0)).is_none());
        let reason = |o: Option<Outcome>| match o {
            Some(Outcome::Refused { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason(judge(Some(&row), Some(0))), Reason::Exists);
        assert_eq!(reason(judge(Some(&row), Some(6))), Reason::Version);
        assert_eq!(reason(judge(None, Some(6))), Reason::Absent);
    }
}
