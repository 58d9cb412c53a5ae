//! How a Kafka record becomes a stored payload and back (docs/kafka.md, "Payloads").
//!
//! The store keeps JSON text, so:
//! - a record with no key, no headers and a value that is JSON text is stored as that text,
//!   byte for byte (an HTTP consumer pops the same JSON; its timestamp becomes the arrival
//!   time);
//! - every other record is stored as an envelope, `{"kafka":{"timestamp":…,"key":…,` then
//!   `"json":<the value's JSON>` or `"value":…`, then `"headers":[[name, …], …]}}`, where a
//!   byte string is `null`, a JSON string (valid UTF-8) or `{"base64":"…"}`.
//!
//! Fetching reverses it: a payload that starts with the envelope's exact opening and parses as
//! one gives back key, value, headers and timestamp; any other payload (an HTTP push) is the
//! value, with no key, no headers, and its arrival time as the timestamp.

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The opening every envelope starts with (and what marks one).
const ENVELOPE_OPENING: &str = "{\"kafka\":{\"timestamp\":";

/// A record's user-visible parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    /// The key.
    pub key: Option<Bytes>,
    /// The value.
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
}

/// Whether `bytes` is JSON text the HTTP side accepts as a payload.
fn is_json(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    let raw: &RawValue = serde_json::from_str(text).ok()?;
    // Surrounding whitespace would be lost in a round trip through RawValue: keep it verbatim
    // only when the text is exactly one JSON value.
    if raw.get().len() != text.len() {
        return None;
    }
    crate::protocol::depth::check(text, "value").ok()?;
    Some(text)
}

/// Writes one byte string of the envelope.
fn push_part(out: &mut String, part: Option<&[u8]>) {
    match part {
        None => out.push_str("null"),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => out.push_str(&serde_json::to_string(text).expect("a string serialises")),
            Err(_) => {
                out.push_str("{\"base64\":\"");
                out.push_str(&base64::engine::general_purpose::STANDARD.encode(bytes));
                out.push_str("\"}");
            }
        },
    }
}

/// The payload stored for a record.
pub fn to_payload(parts: &Parts) -> String {
    if parts.key.is_none() && parts.headers.is_empty() {
        if let Some(text) = parts.value.as_deref().and_then(is_json) {
            return text.to_string();
        }
    }
    let mut out = String::with_capacity(
        64 + parts.value.as_ref().map_or(0, |v| v.len() * 2)
            + parts.key.as_ref().map_or(0, Bytes::len),
    );
    out.push_str(ENVELOPE_OPENING);
    out.push_str(&parts.timestamp.to_string());
    out.push_str(",\"key\":");
    push_part(&mut out, parts.key.as_deref());
    match parts.value.as_deref().and_then(is_json) {
        Some(json) => {
            out.push_str(",\"json\":");
            out.push_str(json);
        }
        None => {
            out.push_str(",\"value\":");
            push_part(&mut out, parts.value.as_deref());
        }
    }
    out.push_str(",\"headers\":[");
    for (i, (name, value)) in parts.headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        out.push_str(&serde_json::to_string(name).expect("a string serialises"));
        out.push(',');
        push_part(&mut out, value.as_deref());
        out.push(']');
    }
    out.push_str("]}}");
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Outer<'a> {
    #[serde(borrow)]
    kafka: Inner<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Inner<'a> {
    timestamp: i64,
    key: Option<Part>,
    #[serde(borrow, default)]
    json: Option<&'a RawValue>,
    #[serde(default)]
    value: Option<Part>,
    headers: Vec<(String, Option<Part>)>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Part {
    Text(String),
    Base64 { base64: String },
}

impl Part {
    fn bytes(self) -> Option<Bytes> {
        match self {
            Part::Text(t) => Some(Bytes::from(t)),
            Part::Base64 { base64 } => base64::engine::general_purpose::STANDARD
                .decode(base64)
                .ok()
                .map(Bytes::from),
        }
    }
}

/// The record a stored payload stands for; `arrived_ms` is the message's arrival time.
pub fn from_payload(payload: &str, arrived_ms: i64) -> Parts {
    if payload.starts_with(ENVELOPE_OPENING) {
        if let Ok(Outer { kafka }) = serde_json::from_str::<Outer>(payload) {
            let value = match kafka.json {
                Some(json) => Some(Bytes::copy_from_slice(json.get().as_bytes())),
                None => kafka.value.and_then(Part::bytes),
            };
            return Parts {
                key: kafka.key.and_then(Part::bytes),
                value,
                headers: kafka
                    .headers
                    .into_iter()
                    .map(|(name, v)| (name, v.and_then(Part::bytes)))
                    .collect(),
                timestamp: kafka.timestamp,
            };
        }
    }
    Parts {
        key: None,
        value: Some(Bytes::copy_from_slice(payload.as_bytes())),
        headers: Vec::new(),
        timestamp: arrived_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(parts: &Parts) -> Parts {
        from_payload(&to_payload(parts), 7)
    }

    #[test]
    fn a_plain_json_value_is_stored_verbatim() {
        let parts = Parts {
            key: None,
            value: Some(Bytes::from_static(br#"{"b":1,"a":[1.50,"\u0041"]}"#)),
            headers: vec![],
            timestamp: 1,
        };
        assert_eq!(to_payload(&parts), r#"{"b":1,"a":[1.50,"\u0041"]}"#);
        // Its timestamp is the arrival time.
        assert_eq!(round_trip(&parts).timestamp, 7);
        assert_eq!(round_trip(&parts).value, parts.value);
    }

    #[test]
    fn keys_headers_text_and_binary_survive_the_envelope() {
        let parts = Parts {
            key: Some(Bytes::from_static(b"k\xff\x00")),
            value: Some(Bytes::from_static(b"plain text, not JSON")),
            headers: vec![
                ("h1".into(), Some(Bytes::from_static(b"v1"))),
                ("h1".into(), None),
                ("bin".into(), Some(Bytes::from_static(&[0, 159, 146, 150]))),
            ],
            timestamp: 1_733_370_000_123,
        };
        let payload = to_payload(&parts);
        serde_json::from_str::<serde_json::Value>(&payload).expect("the envelope is JSON");
        assert_eq!(round_trip(&parts), parts);
        let json_value = Parts {
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"[1, 2]")),
            ..parts.clone()
        };
        assert!(to_payload(&json_value).contains(r#""json":[1, 2]"#));
        assert_eq!(round_trip(&json_value), json_value);
        let null_value = Parts {
            value: None,
            ..parts
        };
        assert_eq!(round_trip(&null_value), null_value);
    }

    #[test]
    fn an_http_payload_is_the_value() {
        let got = from_payload(r#"{"kafka": "not an envelope"}"#, 42);
        assert_eq!(got.key, None);
        assert_eq!(got.timestamp, 42);
        assert_eq!(
            got.value.as_deref(),
            Some(&br#"{"kafka": "not an envelope"}"#[..])
        );
        // The exact opening but not an envelope after all: still just the value.
        let odd = r#"{"kafka":{"timestamp":1,"other":2}}"#;
        assert_eq!(from_payload(odd, 3).value.as_deref(), Some(odd.as_bytes()));
    }
}
