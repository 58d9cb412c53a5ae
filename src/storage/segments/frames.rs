//! The encoding of a segment's `frames` column: the messages of one write, back to back.
//!
//! ```text
//! segment := 1 item*          payloads as received
//!          | 2 item*          payloads sealed (`storage::segments::crypto`)
//!          | 3 run*           the framed layout (written by default since version 3 exists)
//! item    := id:[16] created_at_micros:i64le txn:str16 producer_sub:opt16 trace_id:opt16
//!            payload_len:u32le payload
//! run     := created_at_micros:i64le count:u32le len:u32le frame{count}   (len: the frames' bytes)
//! frame   := body_len:u32le flags:u8 id:[16] txn:len16 [producer_sub:len16 if flags & 2] payload
//! ```
//! An `item` is [`broker_actors::codec`]'s, the bytes the spool's records hold too (`str16`
//! and `opt16` are its length-prefixed strings, `0xFFFF` for none). A `frame` is the record frame
//! of the 2.x binary wire (reference 2.x §2.9.2 and §2.10; `len16` is a plain `u16` length), so
//! a `run` of a version 3 segment is a framed pop's record as it is: a framed pop sends those
//! bytes without framing a message again ([`stored_records`]). Version 3 holds no trace id (a
//! frame would carry it as 16 bytes, losing the text a producer sent) and is never sealed, so a
//! write with a trace id, or of a queue with `encryptionEnabled`, is stored as version 1 or 2.
//!
//! The payload bytes are the JSON text exactly as received, or (version 2) that text sealed in
//! Queen's stored shape: the whole segment is one commit's write of one queue, so one byte says
//! it for every frame. Lengths are bounded by validation (names ≤ 255 characters; payload ≤ the
//! body limit), so the widths above always suffice. Every reader decodes every version; brokers
//! older than version 3 do not, hence `QUEEN_SEGMENT_FORMAT=items` for a rolling upgrade.

use std::sync::atomic::{AtomicBool, Ordering};

use broker_actors::codec::{self, ItemRef, Reader};
use broker_actors::Item;
use uuid::Uuid;

const VERSION: u8 = 1;
/// The version of a segment whose payloads are sealed.
const VERSION_SEALED: u8 = 2;
/// The version of a segment in runs of record frames.
const VERSION_FRAMED: u8 = 3;
/// Frame flag: a producer follows the transaction id.
const FRAME_PRODUCER: u8 = 2;
/// A frame's bytes besides its strings and payload: flags, id and the transaction id's length.
const FRAME_FIXED: usize = 1 + 16 + 2;
/// A run's header: arrival time, count, length.
const RUN_HEADER: usize = 8 + 4 + 4;

/// Whether [`encode`] writes version 1 rather than 3 (`QUEEN_SEGMENT_FORMAT=items`).
static WRITE_ITEMS: AtomicBool = AtomicBool::new(false);

/// Sets the layout [`encode`] writes from now on: `items` (version 1, readable by brokers older
/// than version 3) or the framed one (version 3, the default). Set once at start-up.
pub fn write_items(items: bool) {
    WRITE_ITEMS.store(items, Ordering::Relaxed);
}

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

/// Encodes items as one segment: in the framed layout (version 3) unless an item carries a
/// trace id or a string too long for it, or `QUEEN_SEGMENT_FORMAT=items` is set.
pub fn encode<'a>(items: impl Iterator<Item = &'a Item> + Clone) -> Vec<u8> {
    if !WRITE_ITEMS.load(Ordering::Relaxed) && items.clone().all(framable) {
        encode_framed(items)
    } else {
        encode_items(items)
    }
}

/// Whether an item fits the framed layout.
fn framable(item: &Item) -> bool {
    item.trace_id.is_none()
        && item.transaction_id.len() <= usize::from(u16::MAX)
        && item
            .producer_sub
            .as_ref()
            .is_none_or(|p| p.len() <= usize::from(u16::MAX))
        // The body length word counts the strings and payload as well.
        && item.payload.len() < (u32::MAX as usize) - 2 * usize::from(u16::MAX) - 64
}

/// Bytes one framed frame of `item` takes, its length word included.
fn framed_len(item: &Item) -> usize {
    4 + FRAME_FIXED
        + item.transaction_id.len()
        + item.producer_sub.as_ref().map_or(0, |p| 2 + p.len())
        + item.payload.len()
}

/// Encodes items as one version 3 segment: runs of consecutive items of one arrival time.
/// Every item must be [`framable`].
fn encode_framed<'a>(items: impl Iterator<Item = &'a Item> + Clone) -> Vec<u8> {
    let size = 1 + items
        .clone()
        .map(|i| RUN_HEADER + framed_len(i))
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(VERSION_FRAMED);
    let mut items = items.peekable();
    while let Some(first) = items.next() {
        let at = first.arrived_at_micros;
        out.extend_from_slice(&at.to_le_bytes());
        let header = out.len();
        out.extend_from_slice(&[0; 8]);
        let start = out.len();
        let mut count: u32 = 0;
        for item in std::iter::once(first).chain(std::iter::from_fn(|| {
            items.next_if(|next| next.arrived_at_micros == at)
        })) {
            put_framed(&mut out, item);
            count += 1;
        }
        let len = (out.len() - start) as u32;
        out[header..header + 4].copy_from_slice(&count.to_le_bytes());
        out[header + 4..header + 8].copy_from_slice(&len.to_le_bytes());
    }
    out
}

/// Appends one record frame.
fn put_framed(out: &mut Vec<u8>, item: &Item) {
    let body = framed_len(item) - 4;
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.push(if item.producer_sub.is_some() {
        FRAME_PRODUCER
    } else {
        0
    });
    out.extend_from_slice(item.message_id.as_bytes());
    out.extend_from_slice(&(item.transaction_id.len() as u16).to_le_bytes());
    out.extend_from_slice(item.transaction_id.as_bytes());
    if let Some(producer) = &item.producer_sub {
        out.extend_from_slice(&(producer.len() as u16).to_le_bytes());
        out.extend_from_slice(producer.as_bytes());
    }
    out.extend_from_slice(item.payload.as_bytes());
}

/// Encodes items as one version 1 segment (the layout of brokers before version 3).
pub fn encode_items<'a>(items: impl Iterator<Item = &'a Item> + Clone) -> Vec<u8> {
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
/// [`FrameError`] when the bytes are not a segment written by [`encode`] or [`encode_sealed`].
pub fn decode(bytes: &[u8]) -> Result<Vec<Frame<'_>>, FrameError> {
    decode_from(bytes, 0)?.collect()
}

/// The frames of a segment from the `skip`-th on, decoded one at a time as they are read: the
/// skipped ones are stepped over by their lengths (whole runs at a time in version 3), and
/// nothing past the last one asked for is read.
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
        VERSION_FRAMED => {
            let mut runs = Runs {
                bytes,
                at: 1,
                run: None,
            };
            runs.skip(skip)?;
            return Ok(Frames {
                layout: Layout::Framed(runs),
                failed: false,
            });
        }
        _ => return Err(FrameError("unknown version")),
    };
    for _ in 0..skip {
        if reader.is_done() {
            break;
        }
        reader.skip_item().map_err(|e| FrameError(e.0))?;
    }
    Ok(Frames {
        layout: Layout::Items { reader, encrypted },
        failed: false,
    })
}

/// The frames [`decode_from`] reads lazily.
pub struct Frames<'a> {
    layout: Layout<'a>,
    failed: bool,
}

enum Layout<'a> {
    /// Versions 1 and 2.
    Items { reader: Reader<'a>, encrypted: bool },
    /// Version 3.
    Framed(Runs<'a>),
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = match &mut self.layout {
            Layout::Items { reader, encrypted } => {
                if reader.is_done() {
                    return None;
                }
                reader
                    .item()
                    .map(|item| {
                        let mut frame = Frame::from(item);
                        frame.encrypted = *encrypted;
                        frame
                    })
                    .map_err(|e| FrameError(e.0))
            }
            Layout::Framed(runs) => match runs.next_frame()? {
                Ok((created_at, body)) => framed_frame(body, created_at),
                Err(e) => Err(e),
            },
        };
        self.failed = next.is_err();
        Some(next)
    }
}

/// The run being read in a version 3 segment: its arrival time, frames left, and where it ends.
#[derive(Clone, Copy)]
struct Run {
    created_at: i64,
    left: u32,
    end: usize,
}

/// A cursor over a version 3 segment's runs and frames.
struct Runs<'a> {
    bytes: &'a [u8],
    at: usize,
    run: Option<Run>,
}

impl<'a> Runs<'a> {
    fn take(&mut self, n: usize, end: usize) -> Result<&'a [u8], FrameError> {
        let to = self
            .at
            .checked_add(n)
            .filter(|to| *to <= end)
            .ok_or(FrameError("truncated"))?;
        let out = &self.bytes[self.at..to];
        self.at = to;
        Ok(out)
    }

    fn u32(&mut self, end: usize) -> Result<u32, FrameError> {
        let b = self.take(4, end)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads the next run's header, or `None` at the end of the segment.
    fn next_run(&mut self) -> Option<Result<Run, FrameError>> {
        if self.at == self.bytes.len() {
            return None;
        }
        let end = self.bytes.len();
        Some((|| {
            let at = self.take(8, end)?;
            let created_at = i64::from_le_bytes(at.try_into().expect("8 bytes"));
            let left = self.u32(end)?;
            let len = self.u32(end)? as usize;
            let run_end = self
                .at
                .checked_add(len)
                .filter(|e| *e <= end)
                .ok_or(FrameError("truncated"))?;
            if left == 0 {
                return Err(FrameError("empty run"));
            }
            Ok(Run {
                created_at,
                left,
                end: run_end,
            })
        })())
    }

    /// The next frame's arrival time and body (after its length word).
    fn next_frame(&mut self) -> Option<Result<(i64, &'a [u8]), FrameError>> {
        let run = match self.run {
            Some(run) if run.left > 0 => run,
            Some(run) if self.at != run.end => return Some(Err(FrameError("run length"))),
            _ => match self.next_run()? {
                Ok(run) => run,
                Err(e) => return Some(Err(e)),
            },
        };
        Some((|| {
            let len = self.u32(run.end)? as usize;
            let body = self.take(len, run.end)?;
            self.run = Some(Run {
                left: run.left - 1,
                ..run
            });
            Ok((run.created_at, body))
        })())
    }

    /// Steps over `n` frames: whole runs by their lengths, then frames by theirs.
    fn skip(&mut self, mut n: usize) -> Result<(), FrameError> {
        while n > 0 {
            match self.run {
                Some(run) if run.left > 0 => {
                    if n >= run.left as usize && self.at <= run.end {
                        n -= run.left as usize;
                        self.at = run.end;
                        self.run = Some(Run { left: 0, ..run });
                    } else {
                        let len = self.u32(run.end)? as usize;
                        self.take(len, run.end)?;
                        self.run = Some(Run {
                            left: run.left - 1,
                            ..run
                        });
                        n -= 1;
                    }
                }
                Some(run) if self.at != run.end => return Err(FrameError("run length")),
                _ => match self.next_run() {
                    None => return Ok(()),
                    Some(run) => self.run = Some(run?),
                },
            }
        }
        Ok(())
    }
}

/// Decodes one record frame's body (after its length word).
fn framed_frame(body: &[u8], created_at_micros: i64) -> Result<Frame<'_>, FrameError> {
    if body.len() < FRAME_FIXED {
        return Err(FrameError("truncated"));
    }
    let flags = body[0];
    if flags & !FRAME_PRODUCER != 0 {
        return Err(FrameError("unknown frame flags"));
    }
    let id = Uuid::from_bytes(body[1..17].try_into().expect("16 bytes"));
    let mut rest = &body[17..];
    let mut text = |what: &'static str| -> Result<&str, FrameError> {
        let len = rest
            .get(..2)
            .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
            .ok_or(FrameError("truncated"))?;
        let bytes = rest.get(2..2 + len).ok_or(FrameError("truncated"))?;
        rest = &rest[2 + len..];
        std::str::from_utf8(bytes).map_err(|_| FrameError(what))
    };
    let transaction_id = text("string not utf-8")?;
    let producer_sub = if flags & FRAME_PRODUCER != 0 {
        Some(text("string not utf-8")?)
    } else {
        None
    };
    let payload = std::str::from_utf8(rest).map_err(|_| FrameError("payload not utf-8"))?;
    Ok(Frame {
        id,
        created_at_micros,
        transaction_id,
        producer_sub,
        trace_id: None,
        payload,
        encrypted: false,
    })
}

/// Stored record frames of a version 3 segment, as a framed pop sends them: `count` frames at
/// consecutive offsets from `base_offset`, of one arrival time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredRecord<'a> {
    /// Offset of the first frame.
    pub base_offset: i64,
    /// Arrival time of every frame, microseconds since the Unix epoch.
    pub created_at_micros: i64,
    /// Frames in it.
    pub count: u32,
    /// The frames, each with its length word.
    pub frames: &'a [u8],
}

/// Appends to `out` the stored records of the offsets `from..to` of the segment at
/// `base_offset`, leaving out the offsets in `deleted` (sorted): slices of its runs, cut where
/// the range or a deleted offset cuts them. Only the length words of the frames are read.
/// `false` when the segment is not in the framed layout (and `out` is untouched).
///
/// # Errors
///
/// [`FrameError`] when the segment does not decode.
pub fn stored_records<'a>(
    bytes: &'a [u8],
    base_offset: i64,
    from: i64,
    to: i64,
    deleted: &[i64],
    out: &mut Vec<StoredRecord<'a>>,
) -> Result<bool, FrameError> {
    if bytes.first() != Some(&VERSION_FRAMED) {
        return Ok(false);
    }
    let mut runs = Runs {
        bytes,
        at: 1,
        run: None,
    };
    let mut offset = base_offset;
    while offset < to {
        let Some(run) = runs.next_run() else { break };
        let run = run?;
        let run_to = offset + i64::from(run.left);
        if run_to <= from {
            runs.at = run.end;
            offset = run_to;
            continue;
        }
        // Frames of this run, one at a time: a record is open from `open` on while its
        // offsets are delivered.
        let mut open: Option<(i64, usize)> = None;
        let close = |open: &mut Option<(i64, usize)>, offset: i64, at: usize, out: &mut Vec<_>| {
            if let Some((first, start)) = open.take() {
                out.push(StoredRecord {
                    base_offset: first,
                    created_at_micros: run.created_at,
                    count: (offset - first) as u32,
                    frames: &bytes[start..at],
                });
            }
        };
        while offset < run_to && offset < to {
            let at = runs.at;
            let len = runs.u32(run.end)? as usize;
            runs.take(len, run.end)?;
            let wanted = offset >= from && deleted.binary_search(&offset).is_err();
            match (wanted, open.is_some()) {
                (true, false) => open = Some((offset, at)),
                (false, true) => close(&mut open, offset, at, out),
                _ => {}
            }
            offset += 1;
        }
        close(&mut open, offset, runs.at, out);
        if offset < to {
            if runs.at != run.end {
                return Err(FrameError("run length"));
            }
        } else {
            break;
        }
    }
    Ok(true)
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
        let bytes = encode_items(items.iter());
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

    /// The two items of the pinned segments; the second with `trace` as its trace id.
    fn pinned_items(trace: Option<&str>) -> [Item; 2] {
        [
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
                trace_id: trace.map(String::from),
                arrived_at_micros: -5,
            },
        ]
    }

    #[test]
    fn a_segment_written_by_earlier_code_decodes_and_is_written_the_same() {
        let items = pinned_items(Some("tr"));
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

    /// Items arriving at `times` (one item each), with producer subs on every third.
    fn timed(times: &[i64]) -> Vec<Item> {
        times
            .iter()
            .enumerate()
            .map(|(i, at)| Item {
                arrived_at_micros: *at,
                ..item(
                    &format!("t{i}"),
                    &format!("{{\"n\":{i}}}"),
                    (i % 3 == 0).then_some("sub"),
                )
            })
            .collect()
    }

    #[test]
    fn the_framed_layout_keeps_every_field_in_runs_of_one_arrival_time() {
        let mut items = timed(&[5, 5, 5, 7, 7, 5, -1]);
        items[1].transaction_id = String::new();
        let bytes = encode(items.iter());
        assert_eq!(bytes[0], VERSION_FRAMED);
        // Runs: [5,5,5], [7,7], [5], [-1]; each frame 4 + 1 + 16 + 2 + txn (+ 2 + sub) + payload.
        let frames: usize = items.iter().map(framed_len).sum();
        assert_eq!(bytes.len(), 1 + 4 * RUN_HEADER + frames);
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded.len(), items.len());
        for (f, i) in decoded.iter().zip(&items) {
            assert_eq!(f.id, i.message_id);
            assert_eq!(f.created_at_micros, i.arrived_at_micros);
            assert_eq!(f.transaction_id, i.transaction_id);
            assert_eq!(f.producer_sub, i.producer_sub.as_deref());
            assert_eq!(f.trace_id, None);
            assert_eq!(f.payload, &*i.payload);
            assert!(!f.encrypted);
        }
        for skip in 0..=8 {
            let got: Vec<Frame<'_>> = decode_from(&bytes, skip)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let want: Vec<Frame<'_>> = decoded.iter().skip(skip).cloned().collect();
            assert_eq!(got, want, "skip {skip}");
        }
    }

    #[test]
    fn a_write_with_a_trace_id_is_stored_in_the_items_layout() {
        let mut items = timed(&[1, 1]);
        items[1].trace_id = Some("not-a-uuid".into());
        let bytes = encode(items.iter());
        assert_eq!(bytes, encode_items(items.iter()));
        assert_eq!(decode(&bytes).unwrap()[1].trace_id, Some("not-a-uuid"));
        let mut out = Vec::new();
        assert!(!stored_records(&bytes, 0, 0, 2, &[], &mut out).unwrap());
        assert!(out.is_empty());
    }

    /// A version 3 segment as first written: stored segments keep decoding.
    const PINNED_FRAMED: [u8; 102] = [
        3, // version
        1, 64, 30, 24, 36, 10, 6, 0, // run: created at
        1, 0, 0, 0, // count
        42, 0, 0, 0, // len
        38, 0, 0, 0, 2, // body len, flags: producer
        1, 144, 0, 0, 0, 0, 112, 0, 128, 0, 0, 0, 0, 0, 0, 1, // id
        5, 0, 116, 120, 110, 45, 49, // "txn-1"
        5, 0, 97, 108, 105, 99, 101, // "alice"
        123, 34, 97, 34, 58, 49, 125, // {"a":1}
        251, 255, 255, 255, 255, 255, 255, 255, // run: created at -5
        1, 0, 0, 0, // count
        27, 0, 0, 0, // len
        23, 0, 0, 0, 0, // body len, flags
        1, 144, 0, 0, 0, 0, 112, 0, 128, 0, 0, 0, 0, 0, 0, 2, // id
        0, 0, // ""
        110, 117, 108, 108, // null
    ];

    #[test]
    fn a_framed_segment_written_by_earlier_code_decodes_and_is_written_the_same() {
        let items = pinned_items(None);
        assert_eq!(encode(items.iter()), PINNED_FRAMED);
        let frames = decode(&PINNED_FRAMED).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].producer_sub, Some("alice"));
        assert_eq!(frames[1].created_at_micros, -5);
        assert_eq!(frames[1].payload, "null");
    }

    /// The offsets the records hold, each with its frame's transaction id and arrival time,
    /// read from the records' bytes alone.
    fn offsets_of(records: &[StoredRecord<'_>]) -> Vec<(i64, String, i64)> {
        let mut out = Vec::new();
        for r in records {
            let mut at = 0;
            for i in 0..r.count {
                let len = u32::from_le_bytes(r.frames[at..at + 4].try_into().unwrap()) as usize;
                let f = framed_frame(&r.frames[at + 4..at + 4 + len], r.created_at_micros).unwrap();
                out.push((
                    r.base_offset + i64::from(i),
                    f.transaction_id.to_string(),
                    f.created_at_micros,
                ));
                at += 4 + len;
            }
            assert_eq!(at, r.frames.len(), "a record holds exactly its frames");
        }
        out
    }

    #[test]
    fn stored_records_are_the_runs_cut_to_the_range_and_around_deleted_offsets() {
        let times = [5, 5, 5, 7, 7, 5, -1];
        let items = timed(&times);
        let bytes = encode(items.iter());
        let base = 100;
        for from in base - 1..=base + 8 {
            for to in from..=base + 8 {
                for deleted in [vec![], vec![101], vec![100, 103, 104], vec![102, 105]] {
                    let mut records = Vec::new();
                    assert!(
                        stored_records(&bytes, base, from, to, &deleted, &mut records).unwrap()
                    );
                    let want: Vec<(i64, String, i64)> = (base..base + 7)
                        .filter(|o| (from..to).contains(o) && !deleted.contains(o))
                        .map(|o| {
                            let i = (o - base) as usize;
                            (o, format!("t{i}"), times[i])
                        })
                        .collect();
                    assert_eq!(offsets_of(&records), want, "{from}..{to} less {deleted:?}");
                    // Records of one run at consecutive offsets are one record.
                    let runs = records.len();
                    let mut cuts = 0;
                    for w in want.windows(2) {
                        if w[1].0 != w[0].0 + 1 || w[1].2 != w[0].2 {
                            cuts += 1;
                        }
                    }
                    // Runs of equal times that are not one run (5 at offsets 102 and 105) are
                    // cut by the offset between them or their run boundary.
                    assert!(want.is_empty() || runs > cuts, "{from}..{to}");
                    if deleted.is_empty() && from <= base && to >= base + 7 {
                        assert_eq!(runs, 4, "whole runs go as stored");
                    }
                }
            }
        }
    }

    #[test]
    fn damaged_framed_segments_are_errors_never_panics() {
        let bytes = encode(timed(&[1, 1, 2]).iter());
        for cut in 1..bytes.len() {
            let short = &bytes[..cut];
            let _ = decode(short);
            let _ = decode_from(short, 2).map(|f| f.count());
            let mut out = Vec::new();
            let _ = stored_records(short, 0, 0, 3, &[], &mut out);
            assert!(
                !matches!(decode(short), Ok(f) if f.len() == 3),
                "cut at {cut} is noticed"
            );
        }
        for at in 1..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0xA5;
            let _ = decode(&flipped);
            let mut out = Vec::new();
            let _ = stored_records(&flipped, 0, 0, 3, &[], &mut out);
        }
    }
}
