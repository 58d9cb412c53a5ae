//! The encoding of a segment's `frames` column: the messages of one write, back to back.
//!
//! ```text
//! segment := version:u8(=1) frame*
//! frame   := id:[16] created_at_micros:i64le txn:str16 producer_sub:opt16 trace_id:opt16
//!            payload_len:u32le payload
//! str16   := len:u16le bytes          opt16 := len:u16le bytes | 0xFFFF (null)
//! ```
//! The payload bytes are the JSON text exactly as received. Lengths are bounded by validation
//! (names ≤ 255 characters; payload ≤ the body limit), so the widths above always suffice.

use broker_actors::Item;
use uuid::Uuid;

const VERSION: u8 = 1;
const NULL: u16 = u16::MAX;

/// One decoded message, borrowing from the segment bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<'a> {
    /// Message id.
    pub id: Uuid,
    /// Arrival time, microseconds since the Unix epoch.
    pub created_at_micros: i64,
    /// The dedup key.
    pub transaction_id: &'a str,
    /// Producer's `sub`.
    pub producer_sub: Option<&'a str>,
    /// Trace id.
    pub trace_id: Option<&'a str>,
    /// Payload JSON text, verbatim.
    pub payload: &'a str,
}

/// A `frames` value that cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[error("corrupt segment frames: {0}")]
pub struct FrameError(&'static str);

/// Bytes one item takes in a segment.
pub fn encoded_len(item: &Item) -> usize {
    16 + 8
        + 2
        + item.transaction_id.len()
        + 2
        + item.producer_sub.as_ref().map_or(0, String::len)
        + 2
        + item.trace_id.as_ref().map_or(0, String::len)
        + 4
        + item.payload.len()
}

/// Encodes items as one segment's frames.
pub fn encode<'a>(items: impl Iterator<Item = &'a Item> + Clone) -> Vec<u8> {
    let size = 1 + items.clone().map(encoded_len).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(VERSION);
    for item in items {
        out.extend_from_slice(item.message_id.as_bytes());
        out.extend_from_slice(&item.arrived_at_micros.to_le_bytes());
        put_str(&mut out, Some(&item.transaction_id));
        put_str(&mut out, item.producer_sub.as_deref());
        put_str(&mut out, item.trace_id.as_deref());
        out.extend_from_slice(&(item.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(item.payload.as_bytes());
    }
    out
}

fn put_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        None => out.extend_from_slice(&NULL.to_le_bytes()),
        Some(s) => {
            // Validation keeps these at ≤ 255 characters (≤ 1020 bytes).
            let len = u16::try_from(s.len()).expect("validated string fits u16");
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Decodes every frame of a segment.
///
/// # Errors
///
/// [`FrameError`] when the bytes are not a segment written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<Vec<Frame<'_>>, FrameError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(1)? != [VERSION] {
        return Err(FrameError("unknown version"));
    }
    let mut frames = Vec::new();
    while r.at < bytes.len() {
        let id = Uuid::from_slice(r.take(16)?).map_err(|_| FrameError("bad id"))?;
        let created_at_micros = i64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let transaction_id = r.opt_str()?.ok_or(FrameError("null transaction id"))?;
        let producer_sub = r.opt_str()?;
        let trace_id = r.opt_str()?;
        let len = u32::from_le_bytes(r.take(4)?.try_into().expect("4 bytes")) as usize;
        let payload =
            std::str::from_utf8(r.take(len)?).map_err(|_| FrameError("payload not utf-8"))?;
        frames.push(Frame {
            id,
            created_at_micros,
            transaction_id,
            producer_sub,
            trace_id,
            payload,
        });
    }
    Ok(frames)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(FrameError("truncated"))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn opt_str(&mut self) -> Result<Option<&'a str>, FrameError> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes"));
        if len == NULL {
            return Ok(None);
        }
        let raw = self.take(len as usize)?;
        std::str::from_utf8(raw)
            .map(Some)
            .map_err(|_| FrameError("string not utf-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(txn: &str, payload: &str, sub: Option<&str>) -> Item {
        Item {
            message_id: Uuid::now_v7(),
            transaction_id: txn.into(),
            payload: payload.into(),
            producer_sub: sub.map(String::from),
            trace_id: None,
            arrived_at_micros: 1_700_000_000_000_000,
        }
    }

    #[test]
    fn frames_round_trip_verbatim() {
        let items = [
            item("a", r#"{"b":1,"a":1.10}"#, None),
            item("", "null", Some("alice")),
            item("ü", "\"\\u0000\"", None),
        ];
        let bytes = encode(items.iter());
        let frames = decode(&bytes).unwrap();
        assert_eq!(frames.len(), 3);
        for (f, i) in frames.iter().zip(&items) {
            assert_eq!(f.id, i.message_id);
            assert_eq!(f.transaction_id, i.transaction_id);
            assert_eq!(f.payload, &*i.payload);
            assert_eq!(f.producer_sub, i.producer_sub.as_deref());
            assert_eq!(f.created_at_micros, i.arrived_at_micros);
        }
    }

    #[test]
    fn truncated_frames_are_an_error() {
        let bytes = encode([item("a", "{}", None)].iter());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&[9]).is_err());
    }
}
