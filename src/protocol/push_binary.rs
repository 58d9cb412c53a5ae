//! The binary push bodies of the 2.x clients (reference 2.x §2.9, docs/binary-wire.md), sent
//! with `Content-Type: application/x-queen-push`: `QPB1` on `POST /api/v1/push` and the push
//! groups of `QTB1` on `POST /api/v1/transaction`. Decoding yields the same [`ParsedItem`]s the
//! JSON body yields, checked by the same rules (names, `Default` partition, an empty
//! transaction id means "mint one", a payload is one JSON document within the nesting limit), so
//! everything after the decoder (dedup, verdicts, answers) cannot tell the two bodies apart.
//!
//! ```text
//! QPB1 := "QPB1" u8 flags [u32 raw_len  when flags & 1: the rest is ONE zstd frame of raw_len bytes]
//!         body
//! body := u32 groups, per group: str16 queue, str16 partition, u32 n,
//!           without flag 8: n × ([str16 transaction_id  when flags & 4] u32 len, payload)
//!           with flag 8:    u32 z_len, z   (one zstd frame of n frames, see below)
//! frame := u32 body_len, u8 frame_flags, [16] message_id, [16] trace_id when frame_flags & 1,
//!          str16 transaction_id, [str16 producer when frame_flags & 2], payload
//! QTB1 := "QTB1" u8 flags u32 head_len, head (JSON)  u32 groups, the flag-8 groups
//! ```
//! Integers are little-endian; `str16` is `u16 len` then UTF-8.
//!
//! Never trusts a length: every read is bounds-checked, no allocation is sized by a count the
//! body declares before the bytes behind it have been seen, and decompression is capped by the
//! caller's budget (`QUEEN_MAX_BODY_BYTES`) before a byte is inflated. A malformed body is a
//! [`BinaryError::Malformed`] naming the byte offset and the field; it must never panic.
//! Knows nothing of HTTP: the route maps the errors (400, 413).

use std::fmt;

use serde_json::value::RawValue;
use uuid::Uuid;

use crate::protocol::push::ParsedItem;
use crate::protocol::{depth, Name};

/// The content type of both binary bodies (`QPB1` and `QTB1`).
pub const CONTENT_TYPE: &str = "application/x-queen-push";
/// First bytes of a binary push body.
pub const PUSH_MAGIC: &[u8; 4] = b"QPB1";
/// First bytes of a binary transaction body.
pub const TRANSACTION_MAGIC: &[u8; 4] = b"QTB1";

/// `QPB1` flag: everything after `raw_len` is one zstd frame.
pub const FLAG_ZSTD: u8 = 1;
/// Flag: answer with counts instead of one result per item.
pub const FLAG_COUNTS: u8 = 2;
/// `QPB1` flag: every item carries a transaction id (empty = the broker mints one).
pub const FLAG_TXN: u8 = 4;
/// `QPB1` flag: each group is one zstd frame of stored-format frames (push compression).
pub const FLAG_FRAMES: u8 = 8;

/// Frame flag: a 16-byte trace id follows the message id.
pub const FRAME_TRACE: u8 = 1;
/// Frame flag: a `str16` producer follows the transaction id (ignored: the producer is the
/// token's `sub`, never a field of the body).
pub const FRAME_PRODUCER: u8 = 2;
/// Frame flag: the payload is encrypted (refused: the broker seals payloads itself).
pub const FRAME_ENCRYPTED: u8 = 4;

/// Whether a `Content-Type` header value names the binary bodies (parameters ignored).
pub fn is_binary(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case(CONTENT_TYPE))
}

/// Which bytes an offset counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// The body as sent.
    Body,
    /// The decompressed body of a `QPB1` with flag 1.
    Decompressed,
    /// The decompressed frames of one group (flag 8 and `QTB1`).
    GroupFrames {
        /// Group number, from 0.
        group: usize,
        /// Where the group's zstd frame starts, in the body as sent.
        at: usize,
    },
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Region::Body => Ok(()),
            Region::Decompressed => f.write_str(" of the decompressed body"),
            Region::GroupFrames { group, at } => write!(
                f,
                " of group {group}'s decompressed frames (its zstd frame starts at byte {at})"
            ),
        }
    }
}

/// A field of the binary bodies, for error texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The four magic bytes.
    Magic,
    /// The flags byte.
    Flags,
    /// `raw_len` (flag 1).
    RawLen,
    /// The compressed body (flag 1).
    Compressed,
    /// `head_len` (`QTB1`).
    HeadLen,
    /// The JSON head (`QTB1`).
    Head,
    /// The group count.
    Groups,
    /// A group's queue name (or its length).
    Queue(usize),
    /// A group's partition name (or its length).
    Partition(usize),
    /// A group's message count.
    Count(usize),
    /// A group's compressed frames (`z_len`, `z`).
    GroupFrames(usize),
    /// An item's transaction id (group, item index in the whole body).
    TransactionId(usize, usize),
    /// An item's payload (or its length).
    Payload(usize, usize),
    /// A frame's `body_len`.
    FrameLen(usize, usize),
    /// A frame's flags.
    FrameFlags(usize, usize),
    /// A frame's message id.
    MessageId(usize, usize),
    /// A frame's trace id.
    TraceId(usize, usize),
    /// A frame's producer.
    Producer(usize, usize),
    /// Bytes after the last field.
    Trailing,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Field::Magic => f.write_str("magic"),
            Field::Flags => f.write_str("flags"),
            Field::RawLen => f.write_str("raw_len"),
            Field::Compressed => f.write_str("compressed body"),
            Field::HeadLen => f.write_str("head_len"),
            Field::Head => f.write_str("head"),
            Field::Groups => f.write_str("group count"),
            Field::Queue(g) => write!(f, "group {g} queue"),
            Field::Partition(g) => write!(f, "group {g} partition"),
            Field::Count(g) => write!(f, "group {g} message count"),
            Field::GroupFrames(g) => write!(f, "group {g} frames"),
            Field::TransactionId(g, i) => write!(f, "group {g} item {i} transactionId"),
            Field::Payload(g, i) => write!(f, "group {g} item {i} payload"),
            Field::FrameLen(g, i) => write!(f, "group {g} item {i} frame length"),
            Field::FrameFlags(g, i) => write!(f, "group {g} item {i} frame flags"),
            Field::MessageId(g, i) => write!(f, "group {g} item {i} message id"),
            Field::TraceId(g, i) => write!(f, "group {g} item {i} trace id"),
            Field::Producer(g, i) => write!(f, "group {g} item {i} producer"),
            Field::Trailing => f.write_str("end of body"),
        }
    }
}

/// A binary body that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BinaryError {
    /// The bytes break the layout or a rule of the push contract (a 400).
    #[error("{kind} body: byte {offset}{region}, {field}: {reason}")]
    Malformed {
        /// `QPB1` or `QTB1`.
        kind: &'static str,
        /// Offset of the field's first byte, counted in `region`.
        offset: usize,
        /// Which bytes `offset` counts in.
        region: Region,
        /// The field.
        field: Field,
        /// What is wrong.
        reason: String,
    },
    /// The body decompresses to more than the body limit (a 413).
    #[error("{kind} body decompresses to more than QUEEN_MAX_BODY_BYTES ({limit} bytes)")]
    TooLarge {
        /// `QPB1` or `QTB1`.
        kind: &'static str,
        /// The limit.
        limit: usize,
    },
}

/// A decoded `QPB1` body.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryPush {
    /// Flag 2: answer with counts.
    pub counts: bool,
    /// The items, in wire order (groups in order, items in order inside each).
    pub items: Vec<ParsedItem>,
}

/// A decoded `QTB1` body.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryTransaction<'a> {
    /// Flag 2: the pushes' and acks' results are counted, not listed.
    pub counts: bool,
    /// The JSON head (the bundle minus its pushes); empty when `head_len` is 0.
    pub head: &'a [u8],
    /// Where the head starts in the body.
    pub head_at: usize,
    /// The pushed items, in wire order.
    pub items: Vec<ParsedItem>,
    /// Each item's trace id (frame flag 1), same order as `items`.
    pub trace_ids: Vec<Option<Uuid>>,
}

/// Bounds-checked little-endian reads over one region.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: &'static str,
    region: Region,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], kind: &'static str, region: Region) -> Self {
        Self {
            buf,
            pos: 0,
            kind,
            region,
        }
    }

    fn error(&self, offset: usize, field: Field, reason: impl Into<String>) -> BinaryError {
        BinaryError::Malformed {
            kind: self.kind,
            offset,
            region: self.region,
            field,
            reason: reason.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: usize, field: Field) -> Result<&'a [u8], BinaryError> {
        if n > self.remaining() {
            return Err(self.error(
                self.pos,
                field,
                format!(
                    "needs {n} bytes, only {} left of {}",
                    self.remaining(),
                    self.buf.len()
                ),
            ));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: Field) -> Result<[u8; N], BinaryError> {
        let mut out = [0; N];
        out.copy_from_slice(self.bytes(N, field)?);
        Ok(out)
    }

    fn u8(&mut self, field: Field) -> Result<u8, BinaryError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: Field) -> Result<u16, BinaryError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: Field) -> Result<usize, BinaryError> {
        let n = u32::from_le_bytes(self.array(field)?);
        Ok(usize::try_from(n).expect("usize holds a u32 on the platforms we build for"))
    }

    /// A `str16`, UTF-8 checked; returns it and its offset.
    fn str16(&mut self, field: Field) -> Result<(&'a str, usize), BinaryError> {
        let at = self.pos;
        let len = usize::from(self.u16(field)?);
        let bytes = self.bytes(len, field)?;
        let text = std::str::from_utf8(bytes)
            .map_err(|e| self.error(at, field, format!("is not UTF-8 ({e})")))?;
        Ok((text, at))
    }

    fn end(&self) -> Result<(), BinaryError> {
        if self.remaining() > 0 {
            return Err(self.error(
                self.pos,
                Field::Trailing,
                format!("{} bytes after the last field", self.remaining()),
            ));
        }
        Ok(())
    }
}

/// How many decompressed bytes a body may still produce, and the one decompressor all its
/// frames share (a body of many small groups does not build one per group).
struct Budget {
    left: usize,
    limit: usize,
    kind: &'static str,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

impl Budget {
    fn take(&mut self, n: usize) -> Result<(), BinaryError> {
        self.left = self.left.checked_sub(n).ok_or(BinaryError::TooLarge {
            kind: self.kind,
            limit: self.limit,
        })?;
        Ok(())
    }
}

/// Inflates one zstd frame that must hold exactly `declared` bytes (or, when `None`, the
/// content size its header carries, which is then required). The budget is charged before
/// anything is inflated, and the output buffer is exactly that size: a frame that would
/// produce more fails instead of growing it.
fn inflate(
    z: &[u8],
    declared: Option<usize>,
    budget: &mut Budget,
    at: impl Fn(String) -> BinaryError,
) -> Result<Vec<u8>, BinaryError> {
    match zstd::zstd_safe::find_frame_compressed_size(z) {
        Ok(n) if n == z.len() => {}
        Ok(n) => {
            return Err(at(format!(
                "holds {} bytes after its zstd frame of {n} bytes (one frame expected)",
                z.len() - n
            )))
        }
        Err(_) => return Err(at("is not a zstd frame".into())),
    }
    let content = match zstd::zstd_safe::get_frame_content_size(z) {
        Ok(size) => size.and_then(|s| usize::try_from(s).ok()),
        Err(_) => return Err(at("is not a zstd frame".into())),
    };
    let size = match (declared, content) {
        (Some(d), Some(c)) if d != c => {
            return Err(at(format!("zstd frame says {c} bytes, raw_len says {d}")))
        }
        (Some(d), _) => d,
        (None, Some(c)) => c,
        (None, None) => return Err(at("zstd frame does not carry its content size".into())),
    };
    budget.take(size)?;
    let mut out = Vec::with_capacity(size);
    let decompressor = match &mut budget.decompressor {
        Some(d) => d,
        none => none.insert(
            zstd::bulk::Decompressor::new()
                .map_err(|e| at(format!("zstd decompressor unavailable ({e})")))?,
        ),
    };
    decompressor
        .decompress_to_buffer(z, &mut out)
        .map_err(|e| at(format!("does not decompress to {size} bytes ({e})")))?;
    if out.len() != size {
        return Err(at(format!(
            "decompresses to {} bytes, {size} declared",
            out.len()
        )));
    }
    Ok(out)
}

/// A name field checked by the JSON body's rules: the name rule, and not empty.
fn name(
    r: &Reader<'_>,
    text: &str,
    at: usize,
    field: Field,
    what: &str,
) -> Result<String, BinaryError> {
    if text.is_empty() {
        return Err(r.error(at, field, format!("{what} must not be empty")));
    }
    Name::check(text).map_err(|e| r.error(at, field, format!("{what} {e}")))?;
    Ok(text.to_string())
}

/// A transaction id: the name rule; empty means "the broker mints one".
fn transaction_id(
    r: &Reader<'_>,
    text: &str,
    at: usize,
    field: Field,
) -> Result<Option<String>, BinaryError> {
    if text.is_empty() {
        return Ok(None);
    }
    Name::check(text).map_err(|e| r.error(at, field, format!("transactionId {e}")))?;
    Ok(Some(text.to_string()))
}

/// A payload: one JSON document within the nesting limit, kept as its text (surrounding
/// whitespace trimmed, as the JSON body's `RawValue` keeps it).
fn payload(r: &Reader<'_>, bytes: &[u8], at: usize, field: Field) -> Result<String, BinaryError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| r.error(at, field, format!("is not UTF-8 ({e})")))?;
    let raw: &RawValue = serde_json::from_str(text)
        .map_err(|e| r.error(at, field, format!("is not one JSON document ({e})")))?;
    depth::check(raw.get(), "payload").map_err(|e| r.error(at, field, e.0))?;
    Ok(raw.get().to_string())
}

/// The smallest item of a group without frames, to cap what a declared count may reserve.
const MIN_ITEM_BYTES: usize = 4;
/// The smallest frame.
const MIN_FRAME_BYTES: usize = 4 + 1 + 16 + 2;

/// Output of the group decoder.
#[derive(Default)]
struct Decoded {
    items: Vec<ParsedItem>,
    trace_ids: Vec<Option<Uuid>>,
}

/// Decodes `u32 groups` and the groups after it, to the end of `r`.
fn groups(
    r: &mut Reader<'_>,
    frames: bool,
    with_txn: bool,
    budget: &mut Budget,
    out: &mut Decoded,
) -> Result<(), BinaryError> {
    let count = r.u32(Field::Groups)?;
    for g in 0..count {
        let (queue, at) = r.str16(Field::Queue(g))?;
        let queue = name(r, queue, at, Field::Queue(g), "queue")?;
        let (partition, at) = r.str16(Field::Partition(g))?;
        let partition = name(r, partition, at, Field::Partition(g), "partition")?;
        let n_at = r.pos;
        let n = r.u32(Field::Count(g))?;
        if frames {
            let z_at = r.pos;
            let z_len = r.u32(Field::GroupFrames(g))?;
            let z = r.bytes(z_len, Field::GroupFrames(g))?;
            let at = |reason: String| r.error(z_at, Field::GroupFrames(g), reason);
            let inflated = inflate(z, None, budget, at)?;
            let region = Region::GroupFrames {
                group: g,
                at: z_at + 4,
            };
            let mut fr = Reader::new(&inflated, r.kind, region);
            out.items.reserve(n.min(inflated.len() / MIN_FRAME_BYTES));
            for _ in 0..n {
                frame(&mut fr, g, &queue, &partition, out)?;
            }
            if fr.remaining() > 0 {
                return Err(fr.error(
                    fr.pos,
                    Field::Count(g),
                    format!(
                        "{} bytes of frames left after the {n} messages the group declares (at byte {n_at} of the body)",
                        fr.remaining()
                    ),
                ));
            }
        } else {
            out.items.reserve(n.min(r.remaining() / MIN_ITEM_BYTES));
            for _ in 0..n {
                let i = out.items.len();
                let txn = if with_txn {
                    let (t, at) = r.str16(Field::TransactionId(g, i))?;
                    transaction_id(r, t, at, Field::TransactionId(g, i))?
                } else {
                    None
                };
                let at = r.pos;
                let len = r.u32(Field::Payload(g, i))?;
                let bytes = r.bytes(len, Field::Payload(g, i))?;
                let payload = payload(r, bytes, at, Field::Payload(g, i))?;
                out.items.push(ParsedItem {
                    queue: queue.clone(),
                    partition: partition.clone(),
                    payload,
                    transaction_id: txn,
                    message_id: None,
                });
                out.trace_ids.push(None);
            }
        }
    }
    r.end()
}

/// Decodes one stored-format frame (§2.9.2) of group `g`.
fn frame(
    fr: &mut Reader<'_>,
    g: usize,
    queue: &str,
    partition: &str,
    out: &mut Decoded,
) -> Result<(), BinaryError> {
    let i = out.items.len();
    let start = fr.pos;
    let body_len = fr.u32(Field::FrameLen(g, i))?;
    let body = fr.bytes(body_len, Field::FrameLen(g, i))?;
    // The frame's fields are read from its own bytes, so none can run into the next frame;
    // offsets stay those of the group's frames.
    let mut f = Reader {
        buf: &fr.buf[..start + 4 + body.len()],
        pos: start + 4,
        kind: fr.kind,
        region: fr.region,
    };
    let flags_at = f.pos;
    let flags = f.u8(Field::FrameFlags(g, i))?;
    if flags & FRAME_ENCRYPTED != 0 {
        return Err(f.error(
            flags_at,
            Field::FrameFlags(g, i),
            "encrypted frames are not accepted (the broker seals payloads itself, QUEEN_ENCRYPTION_KEY)",
        ));
    }
    if flags & !(FRAME_TRACE | FRAME_PRODUCER) != 0 {
        return Err(f.error(
            flags_at,
            Field::FrameFlags(g, i),
            format!("unknown frame flags {flags:#04x}"),
        ));
    }
    let id_at = f.pos;
    let id = Uuid::from_bytes(f.array(Field::MessageId(g, i))?);
    if id.get_version_num() != 7 || id.get_variant() != uuid::Variant::RFC4122 {
        return Err(f.error(
            id_at,
            Field::MessageId(g, i),
            format!("{id} is not a version-7 UUID"),
        ));
    }
    let trace = if flags & FRAME_TRACE != 0 {
        Some(Uuid::from_bytes(f.array(Field::TraceId(g, i))?))
    } else {
        None
    };
    let (txn, at) = f.str16(Field::TransactionId(g, i))?;
    let txn = transaction_id(&f, txn, at, Field::TransactionId(g, i))?;
    if flags & FRAME_PRODUCER != 0 {
        // Read to step over it; the producer is the caller's token `sub`, never the body's.
        f.str16(Field::Producer(g, i))?;
    }
    let at = f.pos;
    let rest = f.remaining();
    let bytes = f.bytes(rest, Field::Payload(g, i))?;
    let payload = payload(&f, bytes, at, Field::Payload(g, i))?;
    out.items.push(ParsedItem {
        queue: queue.to_string(),
        partition: partition.to_string(),
        payload,
        transaction_id: txn,
        message_id: Some(id),
    });
    out.trace_ids.push(trace);
    Ok(())
}

/// Reads the magic and the flags; refuses flag bits outside `known`.
fn head(r: &mut Reader<'_>, magic: &[u8; 4], known: u8) -> Result<u8, BinaryError> {
    let got = r.array::<4>(Field::Magic)?;
    if &got != magic {
        return Err(r.error(
            0,
            Field::Magic,
            format!(
                "expected {:?}, got {:?}",
                String::from_utf8_lossy(magic),
                String::from_utf8_lossy(&got)
            ),
        ));
    }
    let flags = r.u8(Field::Flags)?;
    if flags & !known != 0 {
        return Err(r.error(
            4,
            Field::Flags,
            format!("unknown flag bits {:#04x}", flags & !known),
        ));
    }
    Ok(flags)
}

/// Decodes a `QPB1` body. `max_decoded` caps the bytes its zstd frames may inflate to, over
/// the whole body (`QUEEN_MAX_BODY_BYTES`).
///
/// # Errors
///
/// [`BinaryError::Malformed`] naming the offset and field; [`BinaryError::TooLarge`] past
/// `max_decoded`.
pub fn decode_push(bytes: &[u8], max_decoded: usize) -> Result<BinaryPush, BinaryError> {
    let kind = "QPB1";
    let mut r = Reader::new(bytes, kind, Region::Body);
    let flags = head(
        &mut r,
        PUSH_MAGIC,
        FLAG_ZSTD | FLAG_COUNTS | FLAG_TXN | FLAG_FRAMES,
    )?;
    if flags & FLAG_ZSTD != 0 && flags & FLAG_FRAMES != 0 {
        return Err(r.error(
            4,
            Field::Flags,
            "flags 1 (compressed body) and 8 (compressed groups) do not go together",
        ));
    }
    let mut budget = Budget {
        left: max_decoded,
        limit: max_decoded,
        kind,
        decompressor: None,
    };
    let mut out = Decoded::default();
    let with_txn = flags & FLAG_TXN != 0;
    if flags & FLAG_ZSTD != 0 {
        let raw_len = r.u32(Field::RawLen)?;
        let z_at = r.pos;
        let z = r.bytes(r.remaining(), Field::Compressed)?;
        let body = inflate(z, Some(raw_len), &mut budget, |reason| {
            r.error(z_at, Field::Compressed, reason)
        })?;
        let mut inner = Reader::new(&body, kind, Region::Decompressed);
        groups(&mut inner, false, with_txn, &mut budget, &mut out)?;
    } else {
        groups(
            &mut r,
            flags & FLAG_FRAMES != 0,
            with_txn,
            &mut budget,
            &mut out,
        )?;
    }
    Ok(BinaryPush {
        counts: flags & FLAG_COUNTS != 0,
        items: out.items,
    })
}

/// Decodes a `QTB1` body: its JSON head is returned as bytes for the transaction parser, its
/// groups (the flag-8 layout) as items.
///
/// # Errors
///
/// As [`decode_push`].
pub fn decode_transaction(
    bytes: &[u8],
    max_decoded: usize,
) -> Result<BinaryTransaction<'_>, BinaryError> {
    let kind = "QTB1";
    let mut r = Reader::new(bytes, kind, Region::Body);
    let flags = head(&mut r, TRANSACTION_MAGIC, FLAG_COUNTS)?;
    let head_len = r.u32(Field::HeadLen)?;
    let head_at = r.pos;
    let head = r.bytes(head_len, Field::Head)?;
    let mut budget = Budget {
        left: max_decoded,
        limit: max_decoded,
        kind,
        decompressor: None,
    };
    let mut out = Decoded::default();
    groups(&mut r, true, true, &mut budget, &mut out)?;
    Ok(BinaryTransaction {
        counts: flags & FLAG_COUNTS != 0,
        head,
        head_at,
        items: out.items,
        trace_ids: out.trace_ids,
    })
}

/// The bytes a `QPB1` body's zstd frames say they inflate to (flag 1: `raw_len`; flag 8: the
/// content sizes of the groups' frames), read from the headers alone; 0 when there is nothing
/// compressed or the body is malformed (the decoder then says why). What push admission
/// counts before anything is inflated.
pub fn declared_inflated_len(bytes: &[u8]) -> usize {
    let mut r = Reader::new(bytes, "QPB1", Region::Body);
    let Ok(flags) = head(&mut r, PUSH_MAGIC, 0xFF) else {
        return 0;
    };
    if flags & FLAG_ZSTD != 0 {
        return r.u32(Field::RawLen).unwrap_or(0);
    }
    if flags & FLAG_FRAMES == 0 {
        return 0;
    }
    let mut total = 0usize;
    let mut walk = || -> Result<(), BinaryError> {
        let count = r.u32(Field::Groups)?;
        for g in 0..count {
            r.str16(Field::Queue(g))?;
            r.str16(Field::Partition(g))?;
            r.u32(Field::Count(g))?;
            let z_len = r.u32(Field::GroupFrames(g))?;
            let z = r.bytes(z_len, Field::GroupFrames(g))?;
            if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(z) {
                total = total.saturating_add(usize::try_from(size).unwrap_or(usize::MAX));
            }
        }
        Ok(())
    };
    let _ = walk();
    total
}

/// One partition's messages for the encoders.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Queue name.
    pub queue: String,
    /// Partition name.
    pub partition: String,
    /// `(transaction id, payload JSON)`; an empty transaction id lets the broker mint one.
    pub items: Vec<(String, String)>,
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).expect("encoder input: str16 fields fit 65535 bytes");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    let n = u32::try_from(n).expect("encoder input: lengths fit a u32");
    out.extend_from_slice(&n.to_le_bytes());
}

/// Encodes a `QPB1` body without frames (flags 0, 1, 2, 4 as given; flag 4 is added when
/// any item has a transaction id): what the client sends with `binary_push` alone is
/// `encode_push(groups, FLAG_TXN)`. For tests and the bench.
pub fn encode_push(groups: &[Group], flags: u8) -> Vec<u8> {
    let flags = if groups
        .iter()
        .flat_map(|g| &g.items)
        .any(|(t, _)| !t.is_empty())
    {
        flags | FLAG_TXN
    } else {
        flags
    };
    let mut body = Vec::new();
    put_u32(&mut body, groups.len());
    for g in groups {
        put_str16(&mut body, &g.queue);
        put_str16(&mut body, &g.partition);
        put_u32(&mut body, g.items.len());
        for (txn, payload) in &g.items {
            if flags & FLAG_TXN != 0 {
                put_str16(&mut body, txn);
            }
            put_u32(&mut body, payload.len());
            body.extend_from_slice(payload.as_bytes());
        }
    }
    let mut out = PUSH_MAGIC.to_vec();
    out.push(flags);
    if flags & FLAG_ZSTD != 0 {
        put_u32(&mut out, body.len());
        out.extend(zstd::bulk::compress(&body, 1).expect("zstd compresses a buffer"));
    } else {
        out.extend(body);
    }
    out
}

/// Appends `u32 groups` and each group in the flag-8 layout: the messages framed as
/// §2.9.2 says, with a fresh version-7 message id each (an empty transaction id becomes the
/// id's text, as the client does), compressed as one zstd frame per group.
pub fn put_frame_groups(out: &mut Vec<u8>, groups: &[Group]) {
    put_u32(out, groups.len());
    for g in groups {
        let mut frames = Vec::new();
        for (txn, payload) in &g.items {
            let id = Uuid::now_v7();
            let txn = if txn.is_empty() {
                id.to_string()
            } else {
                txn.clone()
            };
            put_u32(&mut frames, 1 + 16 + 2 + txn.len() + payload.len());
            frames.push(0);
            frames.extend_from_slice(id.as_bytes());
            put_str16(&mut frames, &txn);
            frames.extend_from_slice(payload.as_bytes());
        }
        let z = zstd::bulk::compress(&frames, 1).expect("zstd compresses a buffer");
        put_str16(out, &g.queue);
        put_str16(out, &g.partition);
        put_u32(out, g.items.len());
        put_u32(out, z.len());
        out.extend(z);
    }
}

/// Encodes a `QPB1` body with flag 8 (and 2 when `counts`): what the client sends with
/// `binary_push` and `push_compression`. For tests and the bench.
pub fn encode_push_frames(groups: &[Group], counts: bool) -> Vec<u8> {
    let mut out = PUSH_MAGIC.to_vec();
    out.push(FLAG_FRAMES | if counts { FLAG_COUNTS } else { 0 });
    put_frame_groups(&mut out, groups);
    out
}

/// Encodes a `QTB1` body: `head` (JSON, may be empty) and the groups. For tests and the
/// bench.
pub fn encode_transaction(head: &[u8], groups: &[Group], counts: bool) -> Vec<u8> {
    let mut out = TRANSACTION_MAGIC.to_vec();
    out.push(if counts { FLAG_COUNTS } else { 0 });
    put_u32(&mut out, head.len());
    out.extend_from_slice(head);
    put_frame_groups(&mut out, groups);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 1 << 20;

    fn group(queue: &str, partition: &str, items: &[(&str, &str)]) -> Group {
        Group {
            queue: queue.into(),
            partition: partition.into(),
            items: items
                .iter()
                .map(|(t, p)| (t.to_string(), p.to_string()))
                .collect(),
        }
    }

    fn sample() -> Vec<Group> {
        vec![
            group("q", "p1", &[("t1", r#"{"n":1}"#), ("", "2")]),
            group("r", "Default", &[("t3", "null")]),
        ]
    }

    fn malformed(e: BinaryError) -> (usize, Region, Field, String) {
        match e {
            BinaryError::Malformed {
                offset,
                region,
                field,
                reason,
                ..
            } => (offset, region, field, reason),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    fn names(items: &[ParsedItem]) -> Vec<(&str, &str, Option<&str>, &str)> {
        items
            .iter()
            .map(|i| {
                (
                    i.queue.as_str(),
                    i.partition.as_str(),
                    i.transaction_id.as_deref(),
                    i.payload.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn plain_compressed_and_framed_bodies_decode_to_the_same_items() {
        let want = vec![
            ("q", "p1", Some("t1"), r#"{"n":1}"#),
            ("q", "p1", None, "2"),
            ("r", "Default", Some("t3"), "null"),
        ];
        for flags in [0, FLAG_TXN, FLAG_ZSTD | FLAG_TXN, FLAG_COUNTS] {
            let got = decode_push(&encode_push(&sample(), flags), LIMIT).unwrap();
            assert_eq!(names(&got.items), want, "flags {flags}");
            assert_eq!(got.counts, flags & FLAG_COUNTS != 0);
            assert!(got.items.iter().all(|i| i.message_id.is_none()));
        }
        let framed = decode_push(&encode_push_frames(&sample(), true), LIMIT).unwrap();
        assert!(framed.counts);
        // A framed message without a transaction id carries its message id's text.
        let second = &framed.items[1];
        assert_eq!(
            second.transaction_id.as_deref(),
            Some(second.message_id.unwrap().to_string().as_str())
        );
        let mut want_framed = want.clone();
        let id_text = second.transaction_id.clone().unwrap();
        want_framed[1].2 = Some(&id_text);
        assert_eq!(names(&framed.items), want_framed);
        assert!(framed.items.iter().all(|i| i.message_id.is_some()));
    }

    #[test]
    fn the_client_bytes_for_one_item_decode() {
        // What queen-mq 2.6.0 sends for [{"queue":"q","payload":{"a":1},"transactionId":"x"}].
        let mut body = b"QPB1\x04".to_vec();
        body.extend([1, 0, 0, 0, 1, 0, b'q', 7, 0]);
        body.extend(b"Default");
        body.extend([1, 0, 0, 0, 1, 0, b'x', 7, 0, 0, 0]);
        body.extend(br#"{"a":1}"#);
        let got = decode_push(&body, LIMIT).unwrap();
        assert_eq!(
            names(&got.items),
            vec![("q", "Default", Some("x"), r#"{"a":1}"#)]
        );
    }

    #[test]
    fn an_empty_body_of_groups_is_no_items() {
        let got = decode_push(&encode_push(&[], 0), LIMIT).unwrap();
        assert!(got.items.is_empty());
    }

    #[test]
    fn truncation_anywhere_names_an_offset_and_never_panics() {
        for body in [
            encode_push(&sample(), FLAG_TXN),
            encode_push(&sample(), FLAG_ZSTD),
            encode_push_frames(&sample(), false),
            encode_transaction(br#"{"operations":[]}"#, &sample(), false),
        ] {
            for cut in 0..body.len() {
                let err = if body.starts_with(PUSH_MAGIC) {
                    decode_push(&body[..cut], LIMIT).unwrap_err()
                } else {
                    decode_transaction(&body[..cut], LIMIT).unwrap_err()
                };
                assert!(err.to_string().contains("byte "), "{err}");
            }
        }
    }

    #[test]
    fn errors_name_the_byte_and_the_field() {
        let (offset, _, field, reason) = malformed(decode_push(b"QPB2\0", LIMIT).unwrap_err());
        assert_eq!((offset, field), (0, Field::Magic));
        assert!(reason.contains("QPB1"));
        let (offset, _, field, _) = malformed(decode_push(b"QPB1\x10", LIMIT).unwrap_err());
        assert_eq!((offset, field), (4, Field::Flags));
        // The payload of the second item is not JSON: its length word is at byte 24.
        let body = encode_push(&[group("q", "p", &[("", "1"), ("", "{")])], 0);
        let err = decode_push(&body, LIMIT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "QPB1 body: byte 24, group 0 item 1 payload: is not one JSON document (EOF while parsing an object at line 1 column 1)"
        );
        let body = encode_push(&[group("", "p", &[("", "1")])], 0);
        let (offset, _, field, reason) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert_eq!(
            (offset, field, reason.as_str()),
            (9, Field::Queue(0), "queue must not be empty")
        );
        let long = "x".repeat(256);
        let body = encode_push(&[group("q", "p", &[(&long, "1")])], 0);
        let (_, _, field, reason) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert_eq!(field, Field::TransactionId(0, 0));
        assert!(reason.contains("longer than 255"));
        let mut body = encode_push(&sample(), 0);
        body.push(0);
        let (offset, _, field, _) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert_eq!((offset, field), (body.len() - 1, Field::Trailing));
    }

    #[test]
    fn payloads_obey_the_nesting_limit() {
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        let body = encode_push(&[group("q", "p", &[("", &deep)])], 0);
        let (_, _, field, reason) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert_eq!(field, Field::Payload(0, 0));
        assert!(reason.contains("128"), "{reason}");
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(decode_push(
            &encode_push_frames(&[group("q", "p", &[("", &ok)])], false),
            LIMIT
        )
        .is_ok());
        let body = encode_push_frames(&[group("q", "p", &[("", &deep)])], false);
        let (_, region, field, _) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert!(matches!(region, Region::GroupFrames { group: 0, .. }));
        assert_eq!(field, Field::Payload(0, 0));
    }

    #[test]
    fn payload_whitespace_is_trimmed_like_the_json_body() {
        let body = encode_push(&[group("q", "p", &[("", " \n{\"a\": 1} ")])], 0);
        assert_eq!(
            decode_push(&body, LIMIT).unwrap().items[0].payload,
            "{\"a\": 1}"
        );
        let body = encode_push(&[group("q", "p", &[("", "")])], 0);
        assert!(
            decode_push(&body, LIMIT).is_err(),
            "an empty payload is no JSON document"
        );
    }

    #[test]
    fn a_zip_bomb_is_refused_before_it_is_inflated() {
        let big = format!("\"{}\"", "a".repeat(200_000));
        let body = encode_push(&[group("q", "p", &[("", &big)])], FLAG_ZSTD);
        assert!(body.len() < 2_000, "compresses well: {}", body.len());
        assert_eq!(
            decode_push(&body, 100_000).unwrap_err(),
            BinaryError::TooLarge {
                kind: "QPB1",
                limit: 100_000
            }
        );
        assert_eq!(
            declared_inflated_len(&body),
            200_002 + 4 + 2 + 1 + 2 + 1 + 4 + 4
        );
        // The same through frames: the budget is over the whole body, not per group.
        let groups = vec![
            group("q", "a", &[("", &big)]),
            group("q", "b", &[("", &big)]),
        ];
        let body = encode_push_frames(&groups, false);
        assert!(decode_push(&body, 300_000).is_err());
        assert!(decode_push(&body, 500_000).is_ok());
        assert!(declared_inflated_len(&body) > 400_000);
    }

    #[test]
    fn raw_len_must_match_what_the_frame_holds() {
        let mut body = encode_push(&sample(), FLAG_ZSTD);
        let raw = u32::from_le_bytes(body[5..9].try_into().unwrap());
        body[5..9].copy_from_slice(&(raw + 1).to_le_bytes());
        let (offset, _, field, reason) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert_eq!((offset, field), (9, Field::Compressed));
        assert!(reason.contains("raw_len"), "{reason}");
        let mut body = encode_push(&sample(), FLAG_ZSTD);
        body.extend([1, 2, 3]);
        let (_, _, _, reason) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert!(reason.contains("one frame expected"), "{reason}");
    }

    fn framed(frames: &[u8], n: u32) -> Vec<u8> {
        let z = zstd::bulk::compress(frames, 1).unwrap();
        let mut body = b"QPB1\x08".to_vec();
        body.extend(1u32.to_le_bytes());
        body.extend([1, 0, b'q', 1, 0, b'p']);
        body.extend(n.to_le_bytes());
        body.extend((z.len() as u32).to_le_bytes());
        body.extend(z);
        body
    }

    fn one_frame(flags: u8, id: Uuid, extra: &[u8], txn: &str, payload: &str) -> Vec<u8> {
        let mut f = Vec::new();
        let len = 1 + 16 + extra.len() + 2 + txn.len() + payload.len();
        f.extend((len as u32).to_le_bytes());
        f.push(flags);
        f.extend(id.as_bytes());
        f.extend(extra);
        f.extend((txn.len() as u16).to_le_bytes());
        f.extend(txn.as_bytes());
        f.extend(payload.as_bytes());
        f
    }

    #[test]
    fn frames_keep_the_client_id_and_refuse_what_the_broker_must_not_store() {
        let id = Uuid::now_v7();
        let got = decode_push(&framed(&one_frame(0, id, &[], "t", "1"), 1), LIMIT).unwrap();
        assert_eq!(got.items[0].message_id, Some(id));
        // A trace id (flag 1) and a producer (flag 2) are read and stepped over on /push.
        let trace = Uuid::new_v4();
        let mut f = Vec::new();
        let producer = b"mallory";
        let len = 1 + 16 + 16 + 2 + 1 + 2 + producer.len() + 1;
        f.extend((len as u32).to_le_bytes());
        f.push(FRAME_TRACE | FRAME_PRODUCER);
        f.extend(id.as_bytes());
        f.extend(trace.as_bytes());
        f.extend([1, 0, b't']);
        f.extend((producer.len() as u16).to_le_bytes());
        f.extend(producer);
        f.extend(b"7");
        let got = decode_push(&framed(&f, 1), LIMIT).unwrap();
        assert_eq!(got.items[0].payload, "7");
        assert_eq!(got.items[0].transaction_id.as_deref(), Some("t"));

        let enc = decode_push(
            &framed(&one_frame(FRAME_ENCRYPTED, id, &[], "t", "1"), 1),
            LIMIT,
        );
        let (offset, _, field, reason) = malformed(enc.unwrap_err());
        assert_eq!((offset, field), (4, Field::FrameFlags(0, 0)));
        assert!(reason.contains("encrypted"));
        let v4 = Uuid::new_v4();
        let (offset, _, field, _) = malformed(
            decode_push(&framed(&one_frame(0, v4, &[], "t", "1"), 1), LIMIT).unwrap_err(),
        );
        assert_eq!((offset, field), (5, Field::MessageId(0, 0)));
        // One frame where the group says two; two frames where it says one.
        let one = one_frame(0, id, &[], "t", "1");
        assert!(decode_push(&framed(&one, 2), LIMIT).is_err());
        let two = [one.clone(), one.clone()].concat();
        let (_, _, field, reason) = malformed(decode_push(&framed(&two, 1), LIMIT).unwrap_err());
        assert_eq!(field, Field::Count(0));
        assert!(reason.contains("left after"), "{reason}");
        // A frame length that runs past the frames.
        let mut bad = one.clone();
        bad[0] += 1;
        let (offset, _, field, _) = malformed(decode_push(&framed(&bad, 1), LIMIT).unwrap_err());
        assert_eq!((offset, field), (4, Field::FrameLen(0, 0)));
    }

    #[test]
    fn a_frame_without_its_content_size_is_refused() {
        let frames = one_frame(0, Uuid::now_v7(), &[], "t", "1");
        let mut enc = zstd::bulk::Compressor::new(1).unwrap();
        enc.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(false))
            .unwrap();
        let z = enc.compress(&frames).unwrap();
        let mut body = b"QPB1\x08".to_vec();
        body.extend(1u32.to_le_bytes());
        body.extend([1, 0, b'q', 1, 0, b'p']);
        body.extend(1u32.to_le_bytes());
        body.extend((z.len() as u32).to_le_bytes());
        body.extend(z);
        let (offset, _, field, reason) = malformed(decode_push(&body, LIMIT).unwrap_err());
        assert_eq!((offset, field), (19, Field::GroupFrames(0)));
        assert!(reason.contains("content size"), "{reason}");
    }

    #[test]
    fn a_transaction_body_splits_into_head_and_items() {
        let head = br#"{"operations":[],"requiredLeases":[]}"#;
        let body = encode_transaction(head, &sample(), true);
        let got = decode_transaction(&body, LIMIT).unwrap();
        assert!(got.counts);
        assert_eq!(got.head, head);
        assert_eq!(got.head_at, 9);
        assert_eq!(got.items.len(), 3);
        assert_eq!(got.trace_ids, vec![None, None, None]);
        let body = encode_transaction(b"", &[], false);
        let empty = decode_transaction(&body, LIMIT).unwrap();
        assert!(empty.head.is_empty() && empty.items.is_empty());
        let (offset, _, field, _) =
            malformed(decode_transaction(&encode_push(&sample(), 0), LIMIT).unwrap_err());
        assert_eq!((offset, field), (0, Field::Magic));
    }

    #[test]
    fn content_types() {
        assert!(is_binary("application/x-queen-push"));
        assert!(is_binary("Application/X-Queen-Push; charset=binary"));
        assert!(!is_binary("application/json"));
    }
}
