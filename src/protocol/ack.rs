//! Ack objects (the `/ack` body, an `/ack/batch` item, a transaction's ack operation), the
//! small JSON body helpers the routes with free-form bodies share, and an ack result on the
//! wire.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::protocol::{params, ProtocolError};
use crate::storage::consume::acks::{Ack, AckOutcome, AckStatus};
use crate::storage::consume::QUEUE_MODE;
use crate::storage::push::partitions;

/// Parses a JSON request body; an empty one is `{}` when `empty_ok`, else a 400.
///
/// # Errors
///
/// [`ProtocolError`] with the protocol's texts.
pub fn json_body(bytes: &[u8], empty_ok: bool) -> Result<Value, ProtocolError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return if empty_ok {
            Ok(json!({}))
        } else {
            Err(ProtocolError("Empty request body".into()))
        };
    }
    serde_json::from_slice(bytes).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))
}

/// A string field; `null` and other types count as absent.
pub fn opt_str<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

/// The consumer group of a body: absent, `null`, empty or not a string = queue mode.
pub fn group_of(v: &Value) -> String {
    opt_str(v, "consumerGroup")
        .filter(|g| !g.is_empty())
        .unwrap_or(QUEUE_MODE)
        .to_string()
}

/// Parses one ack object (the `/ack` body, an `/ack/batch` item or a transaction op).
///
/// # Errors
///
/// [`ProtocolError`] naming the missing or malformed field.
pub fn parse_ack(
    v: &Value,
    index: usize,
    group: String,
    missing_txn: &str,
    missing_partition: &str,
) -> Result<Ack, ProtocolError> {
    let fields = AckFields {
        transaction_id: opt_str(v, "transactionId"),
        partition_id: opt_str(v, "partitionId"),
        status: match v.get("status") {
            None | Some(Value::Null) => Loose::Absent,
            Some(Value::String(s)) => Loose::Str(Cow::Borrowed(s)),
            Some(_) => Loose::Other,
        },
        lease_id: opt_str(v, "leaseId"),
        error: opt_str(v, "error"),
    };
    fields.into_ack(index, group, missing_txn, missing_partition)
}

/// The fields of one ack object as read from the wire, whatever the reader.
struct AckFields<'v> {
    transaction_id: Option<&'v str>,
    partition_id: Option<&'v str>,
    status: Loose<'v>,
    lease_id: Option<&'v str>,
    error: Option<&'v str>,
}

impl AckFields<'_> {
    fn into_ack(
        self,
        index: usize,
        group: String,
        missing_txn: &str,
        missing_partition: &str,
    ) -> Result<Ack, ProtocolError> {
        let transaction_id = self
            .transaction_id
            .ok_or_else(|| ProtocolError(missing_txn.into()))?
            .to_string();
        // Values PostgreSQL cannot hold are the caller's mistake: a 400 naming the field.
        params::check_value("transactionId", &transaction_id)?;
        params::check_name("consumerGroup", &group)?;
        params::check_text("error", self.error)?;
        params::check_text("leaseId", self.lease_id)?;
        let partition = self
            .partition_id
            .ok_or_else(|| ProtocolError(missing_partition.into()))?;
        // The partition's UUID, or its 64-bit id as decimal text (what a framed pop gives).
        let (partition, partition_number) = match Uuid::parse_str(partition) {
            Ok(uuid) => (uuid, None),
            Err(_) => match partitions::id_of_text(partition) {
                Some(id) => (Uuid::nil(), Some(id)),
                None => {
                    return Err(ProtocolError(format!(
                        "partitionId must be a UUID or a partition's 64-bit id in decimal, got {partition:?}"
                    )))
                }
            },
        };
        let status = match &self.status {
            Loose::Absent => AckStatus::Completed,
            Loose::Str(s) => AckStatus::parse(Some(s)),
            Loose::Other => AckStatus::Unknown,
        };
        Ok(Ack {
            index,
            partition,
            partition_number,
            transaction_id,
            status,
            group,
            lease_id: self.lease_id.map(str::to_string),
            error: self.error.map(str::to_string),
        })
    }
}

/// A JSON value read the way the ack routes read a field: a string, absent or `null`, or
/// anything else (which counts as absent where a string is required).
#[derive(Debug, Default)]
enum Loose<'a> {
    #[default]
    Absent,
    Str(Cow<'a, str>),
    Other,
}

impl<'a> Loose<'a> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }
}

struct LooseVisitor;

impl<'de> Visitor<'de> for LooseVisitor {
    type Value = Loose<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Absent)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Absent)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Value>()?.is_some() {}
        Ok(Loose::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<Cow<'de, str>, Value>()?.is_some() {}
        Ok(Loose::Other)
    }
}

impl<'de> Deserialize<'de> for Loose<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LooseVisitor)
    }
}

/// One ack object of an `/ack` or `/ack/batch` body, read without building a JSON tree (a
/// batch carries hundreds). A value that is not an object reads as an object without fields;
/// of two equal keys the last wins, as with a JSON tree. Values it does not use are still read
/// as JSON values, so it accepts and refuses exactly the bodies a tree does
/// (`fuzz/checks.rs` compares the two).
#[derive(Debug, Default)]
pub struct WireAck<'a> {
    transaction_id: Loose<'a>,
    partition_id: Loose<'a>,
    status: Loose<'a>,
    lease_id: Loose<'a>,
    error: Loose<'a>,
    consumer_group: Loose<'a>,
    acknowledgments: Option<Vec<WireAck<'a>>>,
}

struct WireAckVisitor;

impl<'de> Visitor<'de> for WireAckVisitor {
    type Value = WireAck<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = WireAck::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "transactionId" => out.transaction_id = map.next_value()?,
                "partitionId" => out.partition_id = map.next_value()?,
                "status" => out.status = map.next_value()?,
                "leaseId" => out.lease_id = map.next_value()?,
                "error" => out.error = map.next_value()?,
                "consumerGroup" => out.consumer_group = map.next_value()?,
                "acknowledgments" => {
                    out.acknowledgments = map.next_value::<WireList<'de>>()?.0;
                }
                _ => {
                    map.next_value::<Value>()?;
                }
            }
        }
        Ok(out)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Value>()?.is_some() {}
        Ok(WireAck::default())
    }
    fn visit_borrowed_str<E: de::Error>(self, _: &'de str) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(WireAck::default())
    }
}

impl<'de> Deserialize<'de> for WireAck<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WireAckVisitor)
    }
}

/// `acknowledgments`: an array of ack objects, or (any other value) absent.
struct WireList<'a>(Option<Vec<WireAck<'a>>>);

struct WireListVisitor;

impl<'de> Visitor<'de> for WireListVisitor {
    type Value = WireList<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element::<WireAck<'de>>()? {
            items.push(item);
        }
        Ok(WireList(Some(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<Cow<'de, str>, Value>()?.is_some() {}
        Ok(WireList(None))
    }
    fn visit_borrowed_str<E: de::Error>(self, _: &'de str) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(WireList(None))
    }
}

impl<'de> Deserialize<'de> for WireList<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WireListVisitor)
    }
}

impl<'a> WireAck<'a> {
    /// Reads an `/ack` or `/ack/batch` body; an empty one is a 400.
    ///
    /// # Errors
    ///
    /// [`ProtocolError`] with the protocol's texts.
    pub fn read(bytes: &'a [u8]) -> Result<Self, ProtocolError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ProtocolError("Empty request body".into()));
        }
        serde_json::from_slice(bytes).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))
    }

    /// The consumer group this object names: absent, `null`, empty or not a string = queue
    /// mode (as [`group_of`]).
    pub fn group(&self) -> String {
        self.consumer_group
            .as_str()
            .filter(|g| !g.is_empty())
            .unwrap_or(QUEUE_MODE)
            .to_string()
    }

    /// The `acknowledgments` array, when the body has one.
    pub fn items(&self) -> Option<&[WireAck<'a>]> {
        self.acknowledgments.as_deref()
    }

    /// This object as an ack (see [`parse_ack`], which it reads exactly like).
    ///
    /// # Errors
    ///
    /// [`ProtocolError`] naming the missing or malformed field.
    pub fn to_ack(
        &self,
        index: usize,
        group: String,
        missing_txn: &str,
        missing_partition: &str,
    ) -> Result<Ack, ProtocolError> {
        AckFields {
            transaction_id: self.transaction_id.as_str(),
            partition_id: self.partition_id.as_str(),
            status: match &self.status {
                Loose::Absent => Loose::Absent,
                Loose::Str(s) => Loose::Str(Cow::Borrowed(s)),
                Loose::Other => Loose::Other,
            },
            lease_id: self.lease_id.as_str(),
            error: self.error.as_str(),
        }
        .into_ack(index, group, missing_txn, missing_partition)
    }
}

/// One ack result on the wire (§5): every field always present, `null` when empty, except
/// `noop`, written only when true (2.x, §2.5: an ack below the committed offset).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireOutcome<'o> {
    index: usize,
    transaction_id: &'o str,
    success: bool,
    error: Option<&'o str>,
    queue_name: Option<&'o str>,
    partition_name: Option<&'o str>,
    lease_released: bool,
    dlq: bool,
    #[serde(skip_serializing_if = "is_false")]
    noop: bool,
}

/// Whether `b` is false (serde's `skip_serializing_if` takes a reference).
fn is_false(b: &bool) -> bool {
    !*b
}

impl<'o> From<&'o AckOutcome> for WireOutcome<'o> {
    fn from(o: &'o AckOutcome) -> Self {
        Self {
            index: o.index,
            transaction_id: &o.transaction_id,
            success: o.success,
            error: o.error.as_deref(),
            queue_name: o.queue_name.as_deref(),
            partition_name: o.partition_name.as_deref(),
            lease_released: o.lease_released,
            dlq: o.dlq,
            noop: o.noop,
        }
    }
}

/// The answer of a request whose acks were all applied by the fast path (every one
/// `completed`, one lease of `partition` in `queue`; `released`: the lease ended with the
/// last): the same JSON as [`WireOutcome`]s of those outcomes, written from the acks without
/// building them.
pub fn completed_answer(acks: &[Ack], queue: &str, partition: &str, released: bool) -> Vec<u8> {
    let last = acks.len().saturating_sub(1);
    completed_answer_by(acks, |n| (queue, partition, released && n == last))
}

/// [`completed_answer`] for acks on several partitions of one lease: `at(n)` names the queue
/// and partition of the `n`-th ack and whether the lease of its partition ended with it.
pub fn completed_answer_by<'q>(
    acks: &[Ack],
    at: impl Fn(usize) -> (&'q str, &'q str, bool),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + acks.len() * 200);
    out.push(b'[');
    for (n, a) in acks.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let (queue, partition, released) = at(n);
        let outcome = WireOutcome {
            index: a.index,
            transaction_id: &a.transaction_id,
            success: true,
            error: None,
            queue_name: Some(queue),
            partition_name: Some(partition),
            lease_released: released,
            dlq: false,
            noop: false,
        };
        serde_json::to_writer(&mut out, &outcome).expect("an ack result serialises into a Vec");
    }
    out.push(b']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(index: usize, txn: &str) -> Ack {
        Ack {
            index,
            partition: Uuid::nil(),
            partition_number: None,
            transaction_id: txn.to_string(),
            status: AckStatus::Completed,
            group: QUEUE_MODE.to_string(),
            lease_id: Some(Uuid::nil().to_string()),
            error: None,
        }
    }

    /// The fast path's answer is byte for byte what the general path writes for the same
    /// outcomes: one result per ack, in order, the last one releasing the lease.
    #[test]
    fn the_completed_answer_is_the_outcomes_answer() {
        let acks = [ack(0, "t-1"), ack(1, "quote\"d"), ack(2, "t-3")];
        for released in [false, true] {
            let outcomes: Vec<AckOutcome> = acks
                .iter()
                .map(|a| AckOutcome {
                    index: a.index,
                    transaction_id: a.transaction_id.clone(),
                    success: true,
                    error: None,
                    queue_name: Some("q\\1".to_string()),
                    partition_name: Some("Default".to_string()),
                    lease_released: released && a.index == 2,
                    dlq: false,
                    noop: false,
                })
                .collect();
            let wire: Vec<WireOutcome> = outcomes.iter().map(WireOutcome::from).collect();
            let expected = serde_json::to_vec(&wire).expect("serialises");
            assert_eq!(
                completed_answer(&acks, "q\\1", "Default", released),
                expected
            );
        }
        assert_eq!(completed_answer(&[], "q", "p", true), b"[]");
    }
}
