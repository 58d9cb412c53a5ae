//! The KV and lock ops on the wire (reference 2.x §2.1, §2.2): parsing and validating
//! `{"operations": [...]}` (and a transaction's `kv` rider) into `storage::kv` ops, and writing
//! their outcomes back as the protocol's result objects.
//!
//! Limits (documented in `docs/kv.md`): see the `MAX_*` constants. A broken rule is a
//! [`BadKv`] (the HTTP layer answers 400 `kv_bad_request` or `lock_bad_request`).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Number, Value};

use crate::protocol::time::iso_millis;
use crate::storage::kv::locks::{permit_key, Holder, LockOp, LockOutcome};
use crate::storage::kv::{Batch, Expiry, Op, Outcome, Row, LOCKS_NAMESPACE};

/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 128;
/// Longest key (and getPrefix prefix or `after`), in UTF-8 bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest value, in bytes of its JSON text.
pub const MAX_VALUE_BYTES: usize = 256 * 1024;
/// Most ops in one call (or one transaction's `kv` rider).
pub const MAX_OPS: usize = 1000;
/// Most keys of one `getMany`.
pub const MAX_GET_MANY_KEYS: usize = 1000;
/// Rows of a `getPrefix` page when no `limit` is given.
pub const DEFAULT_PAGE: usize = 100;
/// Most rows of a `getPrefix` page (a larger `limit` is clamped, never refused).
pub const MAX_PAGE: usize = 1000;
/// Longest `ttlSeconds` (ten years).
pub const MAX_TTL_SECONDS: i64 = 10 * 366 * 24 * 3600;
/// Longest lock name and owner, in bytes.
pub const MAX_LOCK_NAME_BYTES: usize = 256;
/// Most permits of a semaphore.
pub const MAX_LOCK_LIMIT: u32 = 1024;

/// A KV or lock request that breaks a rule: a stable `reason` id and the prose.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct BadKv {
    /// Stable id of the broken rule (`bad_namespace`, `bad_key`, `value_too_large`, ...).
    pub reason: &'static str,
    /// What is wrong, naming the op.
    pub detail: String,
}

fn bad(reason: &'static str, detail: impl Into<String>) -> BadKv {
    BadKv {
        reason,
        detail: detail.into(),
    }
}

/// Deserializes a present field (even `null`) as `Some`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    operations: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawOp {
    #[serde(default)]
    op: Option<Value>,
    #[serde(default)]
    ns: Option<Value>,
    #[serde(default)]
    key: Option<Value>,
    #[serde(default)]
    keys: Option<Value>,
    #[serde(default)]
    prefix: Option<Value>,
    #[serde(default)]
    after: Option<Value>,
    #[serde(default)]
    limit: Option<Value>,
    #[serde(default)]
    keys_only: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    value: Option<Box<RawValue>>,
    #[serde(default)]
    ttl_seconds: Option<Value>,
    #[serde(default)]
    forever: Option<Value>,
    #[serde(default)]
    expect: Option<Value>,
    #[serde(default)]
    required: Option<Value>,
    #[serde(default)]
    delta: Option<Value>,
    #[serde(default)]
    min: Option<Value>,
    #[serde(default)]
    max: Option<Value>,
    // Lock ops.
    #[serde(default)]
    name: Option<Value>,
    #[serde(default)]
    owner: Option<Value>,
    #[serde(default)]
    token: Option<Value>,
    #[serde(default)]
    slot: Option<Value>,
}

/// The ops of a request body `{"operations": [...]}` (the bytes as received).
///
/// # Errors
///
/// [`BadKv`] naming the first broken rule.
pub fn operations_of(bytes: &[u8]) -> Result<Vec<Box<RawValue>>, BadKv> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| bad("bad_json", format!("body is not UTF-8: {e}")))?;
    let body: Body = serde_json::from_str(text)
        .map_err(|e| bad("bad_json", format!("body is not a JSON object: {e}")))?;
    let ops = body
        .operations
        .ok_or_else(|| bad("bad_operations", "operations array required"))?;
    list_of(&ops, "operations")
}

/// The elements of a JSON array (`what` names it in the error), at most [`MAX_OPS`], at least
/// one.
///
/// # Errors
///
/// [`BadKv`] when it is not a non-empty array of at most [`MAX_OPS`] elements.
pub fn list_of(raw: &RawValue, what: &str) -> Result<Vec<Box<RawValue>>, BadKv> {
    let ops: Vec<Box<RawValue>> = serde_json::from_str(raw.get()).map_err(|_| {
        bad(
            "bad_operations",
            format!("{what} must be an array of op objects"),
        )
    })?;
    if ops.is_empty() {
        return Err(bad("bad_operations", format!("{what} must not be empty")));
    }
    if ops.len() > MAX_OPS {
        return Err(bad(
            "too_many_operations",
            format!("{what} holds {} ops, at most {MAX_OPS} per call", ops.len()),
        ));
    }
    Ok(ops)
}

fn raw_op(n: usize, raw: &RawValue) -> Result<RawOp, BadKv> {
    serde_json::from_str(raw.get()).map_err(|e| {
        bad(
            "bad_operation",
            format!("operation {n}: not an op object: {e}"),
        )
    })
}

/// Parses KV ops. `in_transaction`: refuse `getPrefix` (unbounded reads do not belong in a
/// transaction).
///
/// # Errors
///
/// [`BadKv`] naming the op and the broken rule.
pub fn parse_ops(raws: &[Box<RawValue>], in_transaction: bool) -> Result<Vec<Op>, BadKv> {
    raws.iter()
        .enumerate()
        .map(|(n, raw)| parse_op(n, &raw_op(n, raw)?, in_transaction))
        .collect()
}

fn string(n: usize, field: &str, v: Option<&Value>) -> Result<String, BadKv> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(bad(
            "missing_field",
            format!("operation {n}: {field} is required"),
        )),
        Some(_) => Err(bad(
            "bad_field",
            format!("operation {n}: {field} must be a string"),
        )),
    }
}

fn namespace(n: usize, v: Option<&Value>) -> Result<String, BadKv> {
    let ns = string(n, "ns", v)?;
    let ok = !ns.is_empty()
        && ns.len() <= MAX_NAMESPACE_BYTES
        && ns.as_bytes()[0].is_ascii_alphanumeric()
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(bad(
            "bad_namespace",
            format!(
                "operation {n}: ns {ns:?} is not a namespace: 1-{MAX_NAMESPACE_BYTES} characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            ),
        ));
    }
    Ok(ns)
}

fn key_text(n: usize, field: &str, s: String) -> Result<String, BadKv> {
    if s.is_empty() || s.len() > MAX_KEY_BYTES || s.chars().any(char::is_control) {
        return Err(bad(
            "bad_key",
            format!(
                "operation {n}: {field} must be 1-{MAX_KEY_BYTES} bytes of UTF-8 without control characters"
            ),
        ));
    }
    Ok(s)
}

fn key(n: usize, v: Option<&Value>) -> Result<String, BadKv> {
    key_text(n, "key", string(n, "key", v)?)
}

fn flag(n: usize, field: &str, v: Option<&Value>) -> Result<bool, BadKv> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(
            "bad_field",
            format!("operation {n}: {field} must be true or false"),
        )),
    }
}

fn int(n: usize, field: &str, v: Option<&Value>) -> Result<Option<i64>, BadKv> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(x)) if x.as_i64().is_some() => Ok(x.as_i64()),
        Some(_) => Err(bad(
            "bad_field",
            format!("operation {n}: {field} must be an integer"),
        )),
    }
}

fn number(n: usize, field: &str, v: Option<&Value>) -> Result<Option<Number>, BadKv> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(x))
            if x.as_i64().is_some() || x.as_f64().is_some_and(f64::is_finite) =>
        {
            Ok(Some(x.clone()))
        }
        Some(_) => Err(bad(
            "bad_field",
            format!("operation {n}: {field} must be a number"),
        )),
    }
}

fn expect(n: usize, v: Option<&Value>) -> Result<Option<i64>, BadKv> {
    match int(n, "expect", v)? {
        Some(e) if e < 0 => Err(bad(
            "bad_expect",
            format!("operation {n}: expect must be 0 (absent) or a version above 0"),
        )),
        other => Ok(other),
    }
}

fn expiry(n: usize, op: &RawOp) -> Result<Expiry, BadKv> {
    let forever = flag(n, "forever", op.forever.as_ref())?;
    let ttl = int(n, "ttlSeconds", op.ttl_seconds.as_ref()).map_err(|_| {
        bad(
            "bad_expiry",
            format!("operation {n}: ttlSeconds must be a whole number of seconds above 0"),
        )
    })?;
    match (ttl, forever) {
        (Some(_), true) | (None, false) => Err(bad(
            "kv_expiry_not_specified",
            format!(
                "operation {n}: exactly one of ttlSeconds (an integer above 0) or forever: true is required"
            ),
        )),
        (Some(s), false) if !(1..=MAX_TTL_SECONDS).contains(&s) => Err(bad(
            "bad_expiry",
            format!("operation {n}: ttlSeconds must be from 1 to {MAX_TTL_SECONDS}"),
        )),
        (Some(s), false) => Ok(Expiry::Ttl(s)),
        (None, true) => Ok(Expiry::Forever),
    }
}

fn value(n: usize, op: &RawOp) -> Result<String, BadKv> {
    let Some(raw) = &op.value else {
        return Err(bad(
            "missing_field",
            format!("operation {n}: value is required (null is a value)"),
        ));
    };
    let text = raw.get();
    if text.len() > MAX_VALUE_BYTES {
        return Err(bad(
            "value_too_large",
            format!(
                "operation {n}: value is {} bytes of JSON, at most {MAX_VALUE_BYTES}",
                text.len()
            ),
        ));
    }
    // PostgreSQL text holds no NUL; a JSON string may spell one as \u0000.
    if text.contains("\\u0000") {
        return Err(bad(
            "bad_value",
            format!("operation {n}: value must not contain \\u0000"),
        ));
    }
    Ok(text.to_string())
}

fn writable(n: usize, ns: String) -> Result<String, BadKv> {
    if ns == LOCKS_NAMESPACE {
        return Err(bad(
            "reserved_namespace",
            format!(
                "operation {n}: namespace {LOCKS_NAMESPACE} holds lock permits and is written only through /api/v1/locks"
            ),
        ));
    }
    Ok(ns)
}

fn parse_op(n: usize, op: &RawOp, in_transaction: bool) -> Result<Op, BadKv> {
    let name = match &op.op {
        Some(Value::String(s)) => s.as_str(),
        _ => {
            return Err(bad(
                "bad_op",
                format!("operation {n}: op must be one of get, getMany, getPrefix, put, putIfAbsent, delete, incr, check"),
            ))
        }
    };
    let required = flag(n, "required", op.required.as_ref())?;
    Ok(match name {
        "get" => Op::Get {
            ns: namespace(n, op.ns.as_ref())?,
            key: key(n, op.key.as_ref())?,
        },
        "getMany" => {
            let ns = namespace(n, op.ns.as_ref())?;
            let keys = match &op.keys {
                Some(Value::Array(keys)) if !keys.is_empty() => keys,
                _ => {
                    return Err(bad(
                        "bad_field",
                        format!("operation {n}: keys must be a non-empty array of keys"),
                    ))
                }
            };
            if keys.len() > MAX_GET_MANY_KEYS {
                return Err(bad(
                    "too_many_keys",
                    format!("operation {n}: keys holds {} keys, at most {MAX_GET_MANY_KEYS}", keys.len()),
                ));
            }
            let keys = keys
                .iter()
                .map(|k| key(n, Some(k)))
                .collect::<Result<Vec<_>, _>>()?;
            Op::GetMany { ns, keys }
        }
        "getPrefix" => {
            if in_transaction {
                return Err(bad(
                    "get_prefix_in_transaction",
                    format!("operation {n}: getPrefix is not allowed inside a transaction"),
                ));
            }
            let ns = namespace(n, op.ns.as_ref())?;
            let prefix = key_text(n, "prefix", string(n, "prefix", op.prefix.as_ref())?)?;
            let after = match &op.after {
                None | Some(Value::Null) => None,
                Some(v) => Some(key_text(n, "after", string(n, "after", Some(v))?)?),
            };
            let limit = match int(n, "limit", op.limit.as_ref())? {
                None => DEFAULT_PAGE,
                Some(l) => usize::try_from(l).unwrap_or(1).clamp(1, MAX_PAGE),
            };
            Op::GetPrefix {
                ns,
                prefix,
                after,
                limit,
                keys_only: flag(n, "keysOnly", op.keys_only.as_ref())?,
            }
        }
        "put" | "putIfAbsent" => {
            let ns = writable(n, namespace(n, op.ns.as_ref())?)?;
            let key = key(n, op.key.as_ref())?;
            let value = value(n, op)?;
            let expiry = expiry(n, op)?;
            let mut expect = expect(n, op.expect.as_ref())?;
            if name == "putIfAbsent" {
                if expect.is_some_and(|e| e != 0) {
                    return Err(bad(
                        "bad_expect",
                        format!("operation {n}: putIfAbsent takes no expect (it is put with expect 0)"),
                    ));
                }
                expect = Some(0);
            }
            Op::Put {
                ns,
                key,
                value,
                expiry,
                expect,
                required,
            }
        }
        "delete" => Op::Delete {
            ns: writable(n, namespace(n, op.ns.as_ref())?)?,
            key: key(n, op.key.as_ref())?,
            expect: expect(n, op.expect.as_ref())?,
            required,
        },
        "incr" => {
            if op.expect.is_some() {
                return Err(bad(
                    "bad_expect",
                    format!("operation {n}: incr takes no expect (use min and max)"),
                ));
            }
            Op::Incr {
                ns: writable(n, namespace(n, op.ns.as_ref())?)?,
                key: key(n, op.key.as_ref())?,
                delta: number(n, "delta", op.delta.as_ref())?.unwrap_or_else(|| Number::from(1)),
                min: number(n, "min", op.min.as_ref())?,
                max: number(n, "max", op.max.as_ref())?,
                expiry: expiry(n, op)?,
                required,
            }
        }
        "check" => Op::Check {
            ns: namespace(n, op.ns.as_ref())?,
            key: key(n, op.key.as_ref())?,
            expect: expect(n, op.expect.as_ref())?.ok_or_else(|| {
                bad(
                    "missing_field",
                    format!("operation {n}: check needs expect (a version, or 0 for absent)"),
                )
            })?,
            required,
        },
        other => {
            return Err(bad(
                "bad_op",
                format!("operation {n}: unknown op {other:?} (get, getMany, getPrefix, put, putIfAbsent, delete, incr, check)"),
            ))
        }
    })
}

/// A stored value as JSON (stored values were validated on the way in).
fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

fn row_json(row: &Row, with_value: bool) -> Value {
    let mut v = json!({
        "key": row.key,
        "version": row.version,
        "expiresAt": row.expires_at.map(iso_millis),
        "updatedAt": iso_millis(row.updated_at),
    });
    if with_value {
        v["value"] = json_of(&row.value);
    }
    v
}

/// One op's result object (with its `index`).
pub fn outcome_json(index: usize, outcome: &Outcome) -> Value {
    let mut v = match outcome {
        Outcome::Found(None) => json!({ "found": false }),
        Outcome::Found(Some(row)) => {
            let mut v = row_json(row, true);
            v["found"] = true.into();
            v
        }
        Outcome::Many {
            rows,
            missing,
            truncated,
        } => {
            let mut v = json!({
                "rows": rows.iter().map(|r| row_json(r, true)).collect::<Vec<_>>(),
                "missing": missing,
            });
            if *truncated {
                v["truncated"] = true.into();
            }
            v
        }
        Outcome::Prefix {
            rows,
            truncated,
            keys_only,
        } => json!({
            "rows": rows.iter().map(|r| row_json(r, !keys_only)).collect::<Vec<_>>(),
            "truncated": truncated,
            "nextAfter": if *truncated { rows.last().map(|r| r.key.clone()) } else { None },
        }),
        Outcome::Applied {
            version,
            value,
            expires_at,
        } => {
            let mut v = json!({ "applied": true, "version": version });
            if let Some(value) = value {
                v["value"] = json_of(value);
            }
            if let Some(at) = expires_at {
                v["expiresAt"] = iso_millis(*at).into();
            }
            v
        }
        Outcome::Refused {
            reason,
            value,
            version,
        } => json!({
            "applied": false,
            "reason": reason.as_str(),
            "value": value.as_deref().map_or(Value::Null, json_of),
            "version": version,
        }),
    };
    v["index"] = index.into();
    v
}

/// The answer of `POST /api/v1/kv`: `{"results": [...]}`, one per op, index-aligned and
/// full-length. When a `required` op lost, nothing applied: that op carries its own verdict,
/// every other op answers `{"index", "rolledBack": true}` (writes also `"applied": false`),
/// and the body adds `"success": false, "reason": "kv_precondition", "failedIndex"`.
pub fn batch_json(ops: &[Op], batch: &Batch) -> Value {
    let Some(failed) = batch.failed else {
        let results: Vec<Value> = batch
            .results
            .iter()
            .enumerate()
            .map(|(i, o)| outcome_json(i, o))
            .collect();
        return json!({ "results": results });
    };
    let results: Vec<Value> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            if i == failed {
                return outcome_json(i, &batch.results[i]);
            }
            match op {
                Op::Get { .. } | Op::GetMany { .. } | Op::GetPrefix { .. } => {
                    json!({ "index": i, "rolledBack": true })
                }
                _ => json!({ "index": i, "applied": false, "rolledBack": true }),
            }
        })
        .collect();
    json!({
        "success": false,
        "reason": "kv_precondition",
        "failedIndex": failed,
        "results": results,
    })
}

fn lock_name(n: usize, v: Option<&Value>) -> Result<String, BadKv> {
    let name = string(n, "name", v)?;
    if name.is_empty()
        || name.len() > MAX_LOCK_NAME_BYTES
        || name.chars().any(|c| c.is_control() || c == '#')
    {
        return Err(bad(
            "bad_name",
            format!("operation {n}: name must be 1-{MAX_LOCK_NAME_BYTES} bytes without control characters and without '#'"),
        ));
    }
    Ok(name)
}

fn owner(n: usize, v: Option<&Value>) -> Result<Option<String>, BadKv> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let owner = string(n, "owner", Some(v))?;
            if owner.is_empty()
                || owner.len() > MAX_LOCK_NAME_BYTES
                || owner.chars().any(char::is_control)
            {
                return Err(bad(
                    "bad_owner",
                    format!("operation {n}: owner must be 1-{MAX_LOCK_NAME_BYTES} bytes without control characters"),
                ));
            }
            Ok(Some(owner))
        }
    }
}

fn lock_ttl(n: usize, v: Option<&Value>) -> Result<i64, BadKv> {
    match int(n, "ttlSeconds", v) {
        Ok(Some(s)) if (1..=MAX_TTL_SECONDS).contains(&s) => Ok(s),
        _ => Err(bad(
            "bad_expiry",
            format!("operation {n}: ttlSeconds must be a whole number from 1 to {MAX_TTL_SECONDS} (a lock has no forever)"),
        )),
    }
}

fn token(n: usize, v: Option<&Value>) -> Result<i64, BadKv> {
    match int(n, "token", v) {
        Ok(Some(t)) if t > 0 => Ok(t),
        _ => Err(bad(
            "bad_token",
            format!("operation {n}: token must be the permit's token (an integer above 0)"),
        )),
    }
}

fn slot(n: usize, v: Option<&Value>) -> Result<Option<u32>, BadKv> {
    match int(n, "slot", v) {
        Ok(None) => Ok(None),
        Ok(Some(s)) if (0..i64::from(MAX_LOCK_LIMIT)).contains(&s) => Ok(u32::try_from(s).ok()),
        _ => Err(bad(
            "bad_slot",
            format!(
                "operation {n}: slot must be an integer from 0 to {}",
                MAX_LOCK_LIMIT - 1
            ),
        )),
    }
}

/// Parses lock ops. An acquire without `owner` gets a fresh one (answered back).
///
/// # Errors
///
/// [`BadKv`] naming the op and the broken rule.
pub fn parse_lock_ops(raws: &[Box<RawValue>]) -> Result<Vec<LockOp>, BadKv> {
    raws.iter()
        .enumerate()
        .map(|(n, raw)| {
            let op = raw_op(n, raw)?;
            let name = lock_name(n, op.name.as_ref())?;
            Ok(match op.op.as_ref().and_then(Value::as_str) {
                Some("acquire") => LockOp::Acquire {
                    name,
                    ttl_seconds: lock_ttl(n, op.ttl_seconds.as_ref())?,
                    owner: owner(n, op.owner.as_ref())?
                        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                    limit: match int(n, "limit", op.limit.as_ref()) {
                        Ok(None) => 1,
                        Ok(Some(l)) if (1..=i64::from(MAX_LOCK_LIMIT)).contains(&l) => {
                            u32::try_from(l).unwrap_or(1)
                        }
                        _ => {
                            return Err(bad(
                                "bad_limit",
                                format!("operation {n}: limit must be an integer from 1 to {MAX_LOCK_LIMIT}"),
                            ))
                        }
                    },
                },
                Some("renew") => LockOp::Renew {
                    name,
                    token: token(n, op.token.as_ref())?,
                    ttl_seconds: lock_ttl(n, op.ttl_seconds.as_ref())?,
                    slot: slot(n, op.slot.as_ref())?,
                    owner: owner(n, op.owner.as_ref())?,
                },
                Some("release") => LockOp::Release {
                    name,
                    token: token(n, op.token.as_ref())?,
                    slot: slot(n, op.slot.as_ref())?,
                },
                Some("get") => LockOp::Get { name },
                _ => {
                    return Err(bad(
                        "bad_op",
                        format!("operation {n}: op must be one of acquire, renew, release, get"),
                    ))
                }
            })
        })
        .collect()
}

/// The `check` op that holds while permit `slot` of `name` is at `token` (`required`).
pub fn guard(name: &str, slot: u32, token: i64) -> Value {
    json!({
        "op": "check",
        "ns": LOCKS_NAMESPACE,
        "key": permit_key(name, slot),
        "expect": token,
        "required": true,
    })
}

fn holders_json(holders: &[Holder]) -> Value {
    holders
        .iter()
        .map(|h| {
            json!({
                "slot": h.slot,
                "owner": h.owner,
                "token": h.token,
                "since": h.since,
                "expiresAt": h.expires_at.map(iso_millis),
                "renewedAt": iso_millis(h.renewed_at),
            })
        })
        .collect()
}

/// One lock op's result object (with its `index`).
pub fn lock_outcome_json(index: usize, op: &LockOp, outcome: &LockOutcome) -> Value {
    let name = match op {
        LockOp::Acquire { name, .. }
        | LockOp::Renew { name, .. }
        | LockOp::Release { name, .. }
        | LockOp::Get { name } => name,
    };
    let mut v = match outcome {
        LockOutcome::Acquired {
            slot,
            token,
            owner,
            already,
        } => {
            let mut v = json!({
                "acquired": true, "slot": slot, "token": token, "owner": owner,
                "guard": guard(name, *slot, *token),
            });
            if *already {
                v["already"] = true.into();
            }
            v
        }
        LockOutcome::Held { holders } => {
            json!({ "acquired": false, "reason": "held", "holders": holders_json(holders) })
        }
        LockOutcome::Renewed { slot, token } => json!({
            "renewed": true, "slot": slot, "token": token, "guard": guard(name, *slot, *token),
        }),
        LockOutcome::Lost { holders } => {
            json!({ "renewed": false, "reason": "lost", "holders": holders_json(holders) })
        }
        LockOutcome::Released(true) => json!({ "released": true }),
        LockOutcome::Released(false) => json!({ "released": false, "reason": "lost" }),
        LockOutcome::Holders(holders) => {
            json!({ "held": !holders.is_empty(), "holders": holders_json(holders) })
        }
    };
    v["index"] = index.into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(body: &str) -> Result<Vec<Op>, BadKv> {
        parse_ops(&operations_of(body.as_bytes())?, false)
    }

    #[test]
    fn a_namespace_with_spaces_is_refused_by_name() {
        let e = ops(r#"{"operations":[{"op":"put","ns":"NOT A NAMESPACE","key":"k","value":1,"ttlSeconds":60}]}"#)
            .unwrap_err();
        assert_eq!(e.reason, "bad_namespace");
    }

    #[test]
    fn expiry_is_exactly_one_declaration() {
        for body in [
            r#"{"operations":[{"op":"put","ns":"a","key":"k","value":1}]}"#,
            r#"{"operations":[{"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":5,"forever":true}]}"#,
        ] {
            assert_eq!(ops(body).unwrap_err().reason, "kv_expiry_not_specified");
        }
        assert_eq!(
            ops(r#"{"operations":[{"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":0}]}"#)
                .unwrap_err()
                .reason,
            "bad_expiry"
        );
    }

    #[test]
    fn null_is_a_value_and_put_if_absent_is_expect_zero() {
        let parsed =
            ops(r#"{"operations":[{"op":"putIfAbsent","ns":"a","key":"k","value":null,"forever":true}]}"#)
                .unwrap();
        match &parsed[0] {
            Op::Put { value, expect, .. } => {
                assert_eq!(value, "null");
                assert_eq!(*expect, Some(0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn get_prefix_is_refused_in_a_transaction_and_its_limit_clamped() {
        let raws = operations_of(
            br#"{"operations":[{"op":"getPrefix","ns":"a","prefix":"p","limit":100000}]}"#,
        )
        .unwrap();
        assert_eq!(
            parse_ops(&raws, true).unwrap_err().reason,
            "get_prefix_in_transaction"
        );
        match &parse_ops(&raws, false).unwrap()[0] {
            Op::GetPrefix { limit, .. } => assert_eq!(*limit, MAX_PAGE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_locks_namespace_is_read_only_here() {
        assert_eq!(
            ops(r#"{"operations":[{"op":"delete","ns":"queen-locks","key":"x#0"}]}"#)
                .unwrap_err()
                .reason,
            "reserved_namespace"
        );
        assert!(ops(
            r#"{"operations":[{"op":"check","ns":"queen-locks","key":"x#0","expect":3}]}"#
        )
        .is_ok());
    }
}
