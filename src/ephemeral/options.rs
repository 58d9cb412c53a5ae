//! The options of an ephemeral queue (`POST /api/v1/ephemeral/configure`): what they mean,
//! their defaults, and the rules a declaration must follow. The stored form is the canonical
//! JSON object [`Options::to_json`] writes (PostgreSQL keeps it, `storage::queues::ephemeral`).

use serde_json::{json, Map, Value};

use crate::ephemeral::EphemeralError;

/// Default `maxBytes`: payload bytes one queue holds.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Default `maxLength`: messages one queue holds.
pub const DEFAULT_MAX_LENGTH: u64 = 100_000;
/// Default `leaseSeconds`.
pub const DEFAULT_LEASE_SECONDS: u64 = 30;
/// Default `retryLimit`: redeliveries after the first delivery.
pub const DEFAULT_RETRY_LIMIT: u32 = 3;
/// Largest `leaseSeconds` and `ttlSeconds` accepted (one day / thirty days).
const MAX_LEASE_SECONDS: u64 = 86_400;
const MAX_TTL_SECONDS: u64 = 30 * 86_400;

/// What a push does when it would take a queue past `maxBytes` or `maxLength`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Refuse the push with 429 and `Retry-After` (the default).
    Reject,
    /// Drop the oldest messages until the push fits (feed semantics).
    DropOldest,
}

impl Policy {
    /// The canonical wire name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::DropOldest => "drop_oldest",
        }
    }
}

/// The options of one ephemeral queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Payload bytes the queue holds at most.
    pub max_bytes: u64,
    /// Messages the queue holds at most.
    pub max_length: u64,
    /// What a push past either bound does.
    pub policy: Policy,
    /// Messages older than this are dropped (0: never).
    pub ttl_seconds: u64,
    /// How long a popped message stays leased to its consumer.
    pub lease_seconds: u64,
    /// Redeliveries after the first delivery; past it a message is dropped and counted.
    pub retry_limit: u32,
    /// `{ms, count}`: stored and echoed; a waiting pop does not hold its answer for it.
    pub window_buffer: Option<(u64, u64)>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            max_length: DEFAULT_MAX_LENGTH,
            policy: Policy::Reject,
            ttl_seconds: 0,
            lease_seconds: DEFAULT_LEASE_SECONDS,
            retry_limit: DEFAULT_RETRY_LIMIT,
            window_buffer: None,
        }
    }
}

fn bad(text: String) -> EphemeralError {
    EphemeralError::BadRequest(text)
}

fn uint(key: &str, v: &Value, min: u64, max: u64) -> Result<u64, EphemeralError> {
    let n = v
        .as_u64()
        .ok_or_else(|| bad(format!("options.{key} must be a non-negative integer")))?;
    if n < min || n > max {
        return Err(bad(format!(
            "options.{key} must be between {min} and {max}"
        )));
    }
    Ok(n)
}

impl Options {
    /// Options from a declaration's `options` object: a key left out keeps its default
    /// (a declaration is a full replace, like `/configure`); an unknown key is refused.
    ///
    /// # Errors
    ///
    /// [`EphemeralError::BadRequest`] naming the key.
    pub fn parse(value: Option<&Value>) -> Result<Self, EphemeralError> {
        let mut out = Self::default();
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(out);
        };
        let map = value
            .as_object()
            .ok_or_else(|| bad("options must be an object".into()))?;
        for (key, v) in map {
            if v.is_null() {
                continue;
            }
            match key.as_str() {
                "maxBytes" => out.max_bytes = uint(key, v, 1, u64::from(u32::MAX) * 16)?,
                "maxLength" => out.max_length = uint(key, v, 1, 100_000_000)?,
                "ttlSeconds" => out.ttl_seconds = uint(key, v, 0, MAX_TTL_SECONDS)?,
                "leaseSeconds" => out.lease_seconds = uint(key, v, 1, MAX_LEASE_SECONDS)?,
                "retryLimit" => out.retry_limit = uint(key, v, 0, 1_000)? as u32,
                "policy" => {
                    out.policy = match v.as_str() {
                        Some("reject") => Policy::Reject,
                        Some("drop_oldest" | "drop-oldest" | "dropOldest" | "drop") => {
                            Policy::DropOldest
                        }
                        _ => {
                            return Err(bad(
                                "options.policy must be \"reject\" or \"drop_oldest\"".into()
                            ))
                        }
                    }
                }
                "windowBuffer" => {
                    let w = v.as_object().ok_or_else(|| {
                        bad("options.windowBuffer must be an object {ms, count}".into())
                    })?;
                    let ms = w
                        .get("ms")
                        .map_or(Ok(0), |m| uint("windowBuffer.ms", m, 0, 60_000))?;
                    let count = w
                        .get("count")
                        .map_or(Ok(0), |c| uint("windowBuffer.count", c, 0, 10_000))?;
                    out.window_buffer = Some((ms, count));
                }
                other => return Err(bad(format!("unknown option {other:?}"))),
            }
        }
        Ok(out)
    }

    /// The canonical JSON object (what is stored and echoed).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("maxBytes".into(), self.max_bytes.into());
        m.insert("maxLength".into(), self.max_length.into());
        m.insert("policy".into(), self.policy.name().into());
        m.insert("ttlSeconds".into(), self.ttl_seconds.into());
        m.insert("leaseSeconds".into(), self.lease_seconds.into());
        m.insert("retryLimit".into(), self.retry_limit.into());
        if let Some((ms, count)) = self.window_buffer {
            m.insert("windowBuffer".into(), json!({ "ms": ms, "count": count }));
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_and_unknown_keys_are_refused() {
        let o = Options::parse(None).expect("defaults");
        assert_eq!(o, Options::default());
        assert_eq!(Options::parse(Some(&o.to_json())).expect("round trip"), o);
        let custom =
            json!({"maxLength": 2, "policy": "drop-oldest", "windowBuffer": {"ms": 5, "count": 2}});
        let c = Options::parse(Some(&custom)).expect("valid");
        assert_eq!(
            (c.max_length, c.policy, c.window_buffer),
            (2, Policy::DropOldest, Some((5, 2)))
        );
        assert!(Options::parse(Some(&json!({"ttl_second": 1}))).is_err());
        assert!(Options::parse(Some(&json!({"maxLength": 0}))).is_err());
        assert!(Options::parse(Some(&json!({"policy": "block"}))).is_err());
        assert!(Options::parse(Some(&json!([1]))).is_err());
    }
}
