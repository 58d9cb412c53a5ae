//! The encoding of a segment's `frames` column: the messages of one write, back to back.
//!
//! ```text
//! segment := version:u8 frame*      version 1: payloads as received
//!                                    version 2: payloads sealed (`storage::segments::crypto`)
//! frame   := id:[16] created_at_micros:i64le txn:str16 producer_sub:opt16 trace_id:opt16
//!            payload_len:u32le payload
//! ```
//! A frame is [`broker_actors::codec`]'s `item`, the bytes the spool's records hold too (`str16`
//! and `opt16` are its length-prefixed strings). The payload bytes are the JSON text exactly as
//! received, or (version 2, a queue with `encryptionEnabled`) that text sealed in Queen's stored
//! shape: the whole segment is one commit's write of one queue, so one byte says it for every
//! frame. Lengths are bounded by validation (names ≤ 255 characters; payload ≤ the body
//! limit), so the widths above always suffice.

use broker_actors::codec::{self, ItemRef, Reader};
use broker_actors::Item;
use uuid::Uuid;

const VERSION: u8 = 1;
/// The version of a segment whose payloads are sealed.
const VERSION_SEALED: u8 = 2;

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
    /// Payload JSON text, verbatim (sealed when `encrypted`).
    pub payload: &'a str,
    /// The payload is sealed ([`crate::storage::segments::crypto`]); it must be opened before delivery.
    pub encrypted: bool,
}

pub use crate::storage::error::FrameError;

/// Bytes one item takes in a segment.
pub fn encoded_len(item: &Item) -> usize {
    codec::item_len(item)
}

/// Encodes items as one segment's frames.
pub fn encode<'a>(items: impl Iterator<Item = &'a Item> + Clone) -> Vec<u8> {
    let size = 1 + items.clone().map(encoded_len).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(VERSION);
    for item in items {
        codec::put_item(&mut out, item);
    }
    out
}

/// Encodes items as one segment's frames, each payload sealed with `key`.
pub fn encode_sealed<'a>(
    items: impl Iterator<Item = &'a Item>,
    key: &crate::storage::segments::crypto::PayloadKey,
) -> Vec<u8> {
    let mut out = vec![VERSION_SEALED];
    for item in items {
        let sealed = Item {
            payload: key.seal(&item.payload).into_boxed_str(),
            ..item.clone()
        };
        codec::put_item(&mut out, &sealed);
    }
    out
}

/// Decodes every frame of a segment.
///
/// # Errors
///
/// [`FrameError`] when the bytes are not a segment written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<Vec<Frame<'_>>, FrameError> {
    decode_from(bytes, 0)?.collect()
}

/// The frames of a segment from the `skip`-th on, decoded one at a time as they are read: the
/// skipped ones are stepped over by their lengths, and nothing past the last one asked for is
/// read.
///
/// # Errors
///
/// [`FrameError`] when the version byte or a skipped frame does not decode; a later frame that
/// does not decode is an `Err` item, and the last one.
pub fn decode_from(bytes: &[u8], skip: usize) -> Result<Frames<'_>, FrameError> {
    let mut reader = Reader::new(bytes);
    let encrypted = match reader.u8().map_err(|e| FrameError(e.0))? {
        VERSION => false,
        VERSION_SEALED => true,
        _ => return Err(FrameError("unknown version")),
    };
    for _ in 0..skip {
        if reader.is_done() {
            break;
        }
        reader.skip_item().map_err(|e| FrameError(e.0))?;
    }
    Ok(Frames {
        reader,
        encrypted,
        failed: false,
    })
}

/// The frames [`decode_from`] reads lazily.
pub struct Frames<'a> {
    reader: Reader<'a>,
    encrypted: bool,
    failed: bool,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.reader.is_done() {
            return None;
        }
        Some(match self.reader.item() {
            Ok(item) => {
                let mut frame = Frame::from(item);
                frame.encrypted = self.encrypted;
                Ok(frame)
            }
            Err(e) => {
                self.failed = true;
                Err(FrameError(e.0))
            }
        })
    }
}

impl<'a> From<ItemRef<'a>> for Frame<'a> {
    fn from(item: ItemRef<'a>) -> Self {
        Self {
            id: item.message_id,
            created_at_micros: item.arrived_at_micros,
            transaction_id: item.transaction_id,
            producer_sub: item.producer_sub,
            trace_id: item.trace_id,
            payload: item.payload,
            encrypted: false,
        }
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
    fn a_sealed_segment_says_so_and_keeps_every_field_but_the_payload() {
        let key = crate::storage::segments::crypto::PayloadKey::new(&[9; 32]);
        let items = [item("a", r#"{"n":1}"#, Some("bob")), item("b", "2", None)];
        let bytes = encode_sealed(items.iter(), &key);
        let frames = decode(&bytes).unwrap();
        assert_eq!(frames.len(), 2);
        for (f, i) in frames.iter().zip(&items) {
            assert!(f.encrypted);
            assert_eq!(
                (f.id, f.transaction_id),
                (i.message_id, i.transaction_id.as_str())
            );
            assert_eq!(f.producer_sub, i.producer_sub.as_deref());
            assert_ne!(f.payload, &*i.payload);
            assert_eq!(key.open(f.payload).unwrap(), &*i.payload);
        }
        assert!(decode(&encode(items.iter()))
            .unwrap()
            .iter()
            .all(|f| !f.encrypted));
    }

    #[test]
    fn decode_from_skips_frames_and_reads_the_rest_lazily() {
        let items: Vec<Item> = (0..5)
            .map(|i| {
                item(
                    &format!("t{i}"),
                    &i.to_string(),
                    (i % 2 == 0).then_some("s"),
                )
            })
            .collect();
        let bytes = encode(items.iter());
        for skip in 0..=6 {
            let got: Vec<Frame<'_>> = decode_from(&bytes, skip)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let want: Vec<Frame<'_>> = decode(&bytes).unwrap().into_iter().skip(skip).collect();
            assert_eq!(got, want, "skip {skip}");
        }
        // A broken frame past the skipped ones is one error, then the end.
        let mut broken = bytes.clone();
        broken.truncate(bytes.len() - 1);
        let mut frames = decode_from(&broken, 3).unwrap();
        assert!(frames.next().unwrap().is_ok());
        assert!(frames.next().unwrap().is_err());
        assert!(frames.next().is_none());
        // A broken frame among the skipped ones fails the call.
        assert!(decode_from(&bytes[..30], 1).is_err());
        assert!(decode_from(&[9], 0).is_err());
    }

    /// A segment as stored before the codec was shared: stored segments keep decoding.
    const PINNED: [u8; 92] = [
        1, // version
        1, 144, 0, 0, 0, 0, 112, 0, 128, 0, 0, 0, 0, 0, 0, 1, // id
        1, 64, 30, 24, 36, 10, 6, 0, // created at
        5, 0, 116, 120, 110, 45, 49, // "txn-1"
        5, 0, 97, 108, 105, 99, 101, // "alice"
        255, 255, // no trace id
        7, 0, 0, 0, 123, 34, 97, 34, 58, 49, 125, // {"a":1}
        1, 144, 0, 0, 0, 0, 112, 0, 128, 0, 0, 0, 0, 0, 0, 2, // id
        251, 255, 255, 255, 255, 255, 255, 255, // created at -5
        0, 0, // ""
        255, 255, // no producer sub
        2, 0, 116, 114, // "tr"
        4, 0, 0, 0, 110, 117, 108, 108, // null
    ];

    #[test]
    fn a_segment_written_by_earlier_code_decodes_and_is_written_the_same() {
        let items = [
            Item {
                message_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
                transaction_id: "txn-1".into(),
                payload: r#"{"a":1}"#.into(),
                producer_sub: Some("alice".into()),
                trace_id: None,
                arrived_at_micros: 1_700_000_000_000_001,
            },
            Item {
                message_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0002),
                transaction_id: String::new(),
                payload: "null".into(),
                producer_sub: None,
                trace_id: Some("tr".into()),
                arrived_at_micros: -5,
            },
        ];
        assert_eq!(encode(items.iter()), PINNED);
        assert_eq!(
            items.iter().map(encoded_len).sum::<usize>() + 1,
            PINNED.len()
        );
        let frames = decode(&PINNED).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].id, items[0].message_id);
        assert_eq!(frames[0].created_at_micros, 1_700_000_000_000_001);
        assert_eq!(frames[0].transaction_id, "txn-1");
        assert_eq!(frames[0].producer_sub, Some("alice"));
        assert_eq!(frames[0].trace_id, None);
        assert_eq!(frames[0].payload, r#"{"a":1}"#);
        assert_eq!(frames[1].created_at_micros, -5);
        assert_eq!(frames[1].transaction_id, "");
        assert_eq!(frames[1].producer_sub, None);
        assert_eq!(frames[1].trace_id, Some("tr"));
        assert_eq!(frames[1].payload, "null");
    }

    #[test]
    fn truncated_frames_are_an_error() {
        let bytes = encode([item("a", "{}", None)].iter());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&[9]).is_err());
    }
}
