//! The byte codec that the spool's records and the stored segments' frames share: little-endian
//! integers, length-prefixed strings, and one item's fields in a fixed order.
//!
//! ```text
//! item  := message_id:[16] arrived_at_micros:i64le transaction_id:str16 producer_sub:opt16
//!          trace_id:opt16 payload_len:u32le payload
//! str16 := len:u16le bytes            opt16 := len:u16le bytes | 0xFFFF (null)
//! ```
//! Both encodings are stored (spool files on disk, the `frames` column in PostgreSQL), so a
//! byte changed here makes old data unreadable; the tests pin the bytes. Strings are bounded by
//! validation (names and keys ≤ 255 characters), so a u16 length always suffices; a longer one
//! is cut at a character boundary rather than panicking.

use uuid::Uuid;

use crate::message::Item;

/// The length word of a null `opt16`.
pub const NULL: u16 = u16::MAX;
/// Longest string body a `str16` holds (one below [`NULL`]).
const MAX_STR: usize = (u16::MAX - 1) as usize;

/// Bytes that do not decode: what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub &'static str);

/// `s` cut to what a `str16` holds, at a character boundary.
fn fitted(s: &str) -> &str {
    if s.len() <= MAX_STR {
        return s;
    }
    let mut end = MAX_STR;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends a `str16`.
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_opt_str(out, Some(s));
}

/// Appends an `opt16`.
pub fn put_opt_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        None => out.extend_from_slice(&NULL.to_le_bytes()),
        Some(s) => {
            let s = fitted(s);
            let len = u16::try_from(s.len()).unwrap_or(NULL - 1);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Bytes [`put_opt_str`] writes for `value`.
pub fn opt_str_len(value: Option<&str>) -> usize {
    2 + value.map_or(0, |s| fitted(s).len())
}

/// Bytes [`put_item`] writes for `item`.
pub fn item_len(item: &Item) -> usize {
    16 + 8
        + opt_str_len(Some(&item.transaction_id))
        + opt_str_len(item.producer_sub.as_deref())
        + opt_str_len(item.trace_id.as_deref())
        + 4
        + item.payload.len()
}

/// Appends an `item`.
pub fn put_item(out: &mut Vec<u8>, item: &Item) {
    out.extend_from_slice(item.message_id.as_bytes());
    out.extend_from_slice(&item.arrived_at_micros.to_le_bytes());
    put_str(out, &item.transaction_id);
    put_opt_str(out, item.producer_sub.as_deref());
    put_opt_str(out, item.trace_id.as_deref());
    // Payloads are bounded by the request body limit, far below 4 GiB.
    out.extend_from_slice(&(item.payload.len() as u32).to_le_bytes());
    out.extend_from_slice(item.payload.as_bytes());
}

/// One decoded `item`, borrowing its strings from the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemRef<'a> {
    /// Message id.
    pub message_id: Uuid,
    /// Arrival time, microseconds since the Unix epoch.
    pub arrived_at_micros: i64,
    /// The dedup key.
    pub transaction_id: &'a str,
    /// Producer's `sub`.
    pub producer_sub: Option<&'a str>,
    /// Trace id.
    pub trace_id: Option<&'a str>,
    /// Payload JSON text, verbatim.
    pub payload: &'a str,
}

impl ItemRef<'_> {
    /// An owned [`Item`] with the same fields.
    pub fn to_item(&self) -> Item {
        Item {
            message_id: self.message_id,
            transaction_id: self.transaction_id.to_string(),
            payload: self.payload.into(),
            producer_sub: self.producer_sub.map(str::to_string),
            trace_id: self.trace_id.map(str::to_string),
            arrived_at_micros: self.arrived_at_micros,
        }
    }
}

/// Reads the encodings above from a byte slice, front to back.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Whether every byte is consumed.
    pub fn is_done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    ///
    /// `truncated` when fewer are left.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(CodecError("truncated"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A `u8`.
    ///
    /// # Errors
    ///
    /// `truncated`.
    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }

    /// A `u32le`.
    ///
    /// # Errors
    ///
    /// `truncated`.
    pub fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// An `i64le`.
    ///
    /// # Errors
    ///
    /// `truncated`.
    pub fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// An `opt16`.
    ///
    /// # Errors
    ///
    /// `truncated` or `string not utf-8`.
    pub fn opt_str(&mut self) -> Result<Option<&'a str>, CodecError> {
        let len = u16::from_le_bytes(self.array()?);
        if len == NULL {
            return Ok(None);
        }
        let raw = self.take(len as usize)?;
        std::str::from_utf8(raw)
            .map(Some)
            .map_err(|_| CodecError("string not utf-8"))
    }

    /// A `str16`; `null` is the error to report when it is null.
    ///
    /// # Errors
    ///
    /// `truncated`, `string not utf-8` or `null`.
    pub fn str(&mut self, null: &'static str) -> Result<&'a str, CodecError> {
        self.opt_str()?.ok_or(CodecError(null))
    }

    /// Steps over an `item` by its lengths, without checking its strings.
    ///
    /// # Errors
    ///
    /// `truncated`, or `null transaction id`.
    pub fn skip_item(&mut self) -> Result<(), CodecError> {
        self.take(16 + 8)?;
        let txn = u16::from_le_bytes(self.array()?);
        if txn == NULL {
            return Err(CodecError("null transaction id"));
        }
        self.take(txn as usize)?;
        for _ in 0..2 {
            let len = u16::from_le_bytes(self.array()?);
            if len != NULL {
                self.take(len as usize)?;
            }
        }
        let len = self.u32()? as usize;
        self.take(len)?;
        Ok(())
    }

    /// An `item`.
    ///
    /// # Errors
    ///
    /// [`CodecError`] naming the first field that does not decode.
    pub fn item(&mut self) -> Result<ItemRef<'a>, CodecError> {
        let message_id = Uuid::from_bytes(self.array()?);
        let arrived_at_micros = self.i64()?;
        let transaction_id = self.str("null transaction id")?;
        let producer_sub = self.opt_str()?;
        let trace_id = self.opt_str()?;
        let len = self.u32()? as usize;
        let payload =
            std::str::from_utf8(self.take(len)?).map_err(|_| CodecError("payload not utf-8"))?;
        Ok(ItemRef {
            message_id,
            arrived_at_micros,
            transaction_id,
            producer_sub,
            trace_id,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes written by the codec before it was shared; they must keep decoding and keep being
    /// what is written.
    const ITEM: [u8; 51] = [
        1, 144, 0, 0, 0, 0, 112, 0, 128, 0, 0, 0, 0, 0, 0, 1, // message id
        1, 64, 30, 24, 36, 10, 6, 0, // arrived at
        5, 0, 116, 120, 110, 45, 49, // "txn-1"
        5, 0, 97, 108, 105, 99, 101, // "alice"
        255, 255, // no trace id
        7, 0, 0, 0, 123, 34, 97, 34, 58, 49, 125, // {"a":1}
    ];

    fn item() -> Item {
        Item {
            message_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
            transaction_id: "txn-1".into(),
            payload: r#"{"a":1}"#.into(),
            producer_sub: Some("alice".into()),
            trace_id: None,
            arrived_at_micros: 1_700_000_000_000_001,
        }
    }

    #[test]
    fn an_item_encodes_to_the_pinned_bytes_and_back() {
        let mut out = Vec::new();
        put_item(&mut out, &item());
        assert_eq!(out, ITEM);
        assert_eq!(item_len(&item()), ITEM.len());
        let mut r = Reader::new(&ITEM);
        assert_eq!(r.item().unwrap().to_item(), item());
        assert!(r.is_done());
    }

    #[test]
    fn every_cut_short_item_is_an_error() {
        for end in 0..ITEM.len() {
            assert!(Reader::new(&ITEM[..end]).item().is_err(), "cut at {end}");
        }
    }

    #[test]
    fn null_and_invalid_strings_are_named() {
        assert_eq!(
            Reader::new(&[255, 255]).str("null queue"),
            Err(CodecError("null queue"))
        );
        assert_eq!(
            Reader::new(&[1, 0, 0xff]).opt_str(),
            Err(CodecError("string not utf-8"))
        );
    }

    #[test]
    fn an_oversized_string_is_cut_at_a_character_boundary() {
        let long = "€".repeat(30_000); // 90 000 bytes, 3 per character
        let mut out = Vec::new();
        put_str(&mut out, &long);
        assert_eq!(out.len(), opt_str_len(Some(&long)));
        let read = Reader::new(&out).str("null").unwrap();
        assert_eq!(read.len(), MAX_STR - 2); // 65 534 is mid-character: back to 65 532
        assert!(long.starts_with(read));
    }
}
