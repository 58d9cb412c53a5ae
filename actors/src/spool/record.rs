//! The spool's on-disk record format.
//!
//! ```text
//! record := magic:u32le crc32:u32le len:u32le body[len]
//! body   := queue:str16 partition:str16 message_id:[16] arrived_at_micros:i64le
//!           transaction_id:str16 producer_sub:opt16 trace_id:opt16 payload_len:u32le payload
//! ```
//! `str16`, `opt16` and the item fields from `message_id` on are [`crate::codec`]'s, shared
//! with the stored segments' frames. The checksum covers the body. A reader that meets a bad magic, a bad checksum or a record
//! running past the end reports it and searches for the next magic, so a torn tail or a damaged
//! record never becomes a message and never hides the good records after it.

use crate::codec::{self, Reader};
use crate::message::{Item, PartitionKey};

/// Marks the start of every record ("QSP1").
pub const MAGIC: u32 = 0x3150_5351;
const HEADER: usize = 12;

/// One spooled item with its partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The partition it goes to.
    pub key: PartitionKey,
    /// The item as accepted (id, key, payload, producerSub, arrival time).
    pub item: Item,
}

/// Damage found while reading a spool file.
#[derive(Debug, Clone, PartialEq)]
pub struct Damage {
    /// Byte offset where it starts.
    pub at: usize,
    /// Bytes skipped.
    pub skipped: usize,
    /// What was wrong.
    pub reason: &'static str,
}

/// Appends one record to `out`.
pub fn encode(key: &PartitionKey, item: &Item, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[0; 8]); // checksum and length, filled in below
    let body = out.len();
    codec::put_str(out, &key.queue);
    codec::put_str(out, &key.partition);
    codec::put_item(out, item);
    let crc = crc32fast::hash(&out[body..]);
    let len = (out.len() - body) as u32;
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&len.to_le_bytes());
}

/// Reads every intact record of a spool file, reporting damage instead of failing.
pub fn decode_all(bytes: &[u8]) -> (Vec<Record>, Vec<Damage>) {
    let (records, damage, _) = decode_some(bytes, 0, usize::MAX);
    (records, damage)
}

/// Reads up to `max` intact records starting at byte `from`, reporting damage on the way;
/// returns them with the byte offset where reading stopped (the file's end when it got there).
pub fn decode_some(bytes: &[u8], from: usize, max: usize) -> (Vec<Record>, Vec<Damage>, usize) {
    let mut records = Vec::new();
    let mut damage: Vec<Damage> = Vec::new();
    let mut at = from;
    while at < bytes.len() && records.len() < max {
        match decode_one(&bytes[at..]) {
            Ok((record, used)) => {
                records.push(record);
                at += used;
            }
            Err(reason) => {
                let next = find_magic(bytes, at + 1).unwrap_or(bytes.len());
                damage.push(Damage {
                    at,
                    skipped: next - at,
                    reason,
                });
                at = next;
            }
        }
    }
    (records, damage, at)
}

fn find_magic(bytes: &[u8], from: usize) -> Option<usize> {
    let magic = MAGIC.to_le_bytes();
    (from..bytes.len().saturating_sub(3)).find(|&i| bytes[i..i + 4] == magic)
}

fn decode_one(bytes: &[u8]) -> Result<(Record, usize), &'static str> {
    if bytes.len() < HEADER {
        return Err("torn record header");
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    if word(0) != MAGIC {
        return Err("bad magic");
    }
    let (crc, len) = (word(4), word(8) as usize);
    let body = bytes.get(HEADER..HEADER + len).ok_or("torn record body")?;
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch");
    }
    let record = decode_body(body).map_err(|e| e.0)?;
    Ok((record, HEADER + len))
}

fn decode_body(body: &[u8]) -> Result<Record, codec::CodecError> {
    let mut r = Reader::new(body);
    let queue = r.str("null queue")?;
    let partition = r.str("null partition")?;
    let item = r.item()?.to_item();
    if !r.is_done() {
        return Err(codec::CodecError("trailing bytes in record"));
    }
    Ok(Record {
        key: PartitionKey::new(queue, partition),
        item,
    })
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn record(n: u32) -> Record {
        Record {
            key: PartitionKey::new("q", "p"),
            item: Item {
                message_id: Uuid::now_v7(),
                transaction_id: format!("t{n}"),
                payload: format!(r#"{{"n":{n}}}"#).into(),
                producer_sub: n.is_multiple_of(2).then(|| "alice".to_string()),
                trace_id: None,
                arrived_at_micros: 42,
            },
        }
    }

    fn file(records: &[Record]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            encode(&r.key, &r.item, &mut out);
        }
        out
    }

    /// A record as the spool wrote it before the codec was shared: files on disk keep decoding.
    const PINNED: [u8; 77] = [
        81, 83, 80, 49, 153, 225, 117, 166, 65, 0, 0, 0, // magic, crc32, length 65
        6, 0, 111, 114, 100, 101, 114, 115, // "orders"
        4, 0, 112, 45, 195, 188, // "p-ü"
        1, 144, 0, 0, 0, 0, 112, 0, 128, 0, 0, 0, 0, 0, 0, 1, // message id
        1, 64, 30, 24, 36, 10, 6, 0, // arrived at
        5, 0, 116, 120, 110, 45, 49, // "txn-1"
        5, 0, 97, 108, 105, 99, 101, // "alice"
        255, 255, // no trace id
        7, 0, 0, 0, 123, 34, 97, 34, 58, 49, 125, // {"a":1}
    ];

    #[test]
    fn a_record_written_by_earlier_code_decodes_and_is_written_the_same() {
        let expected = Record {
            key: PartitionKey::new("orders", "p-ü"),
            item: Item {
                message_id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
                transaction_id: "txn-1".into(),
                payload: r#"{"a":1}"#.into(),
                producer_sub: Some("alice".into()),
                trace_id: None,
                arrived_at_micros: 1_700_000_000_000_001,
            },
        };
        let (read, damage) = decode_all(&PINNED);
        assert!(damage.is_empty(), "{damage:?}");
        assert_eq!(file(&read), PINNED);
        assert_eq!(read, [expected]);
    }

    #[test]
    fn records_round_trip() {
        let records: Vec<Record> = (0..5).map(record).collect();
        let (read, damage) = decode_all(&file(&records));
        assert_eq!(read, records);
        assert!(damage.is_empty());
    }

    #[test]
    fn a_torn_tail_is_reported_and_the_good_records_survive() {
        let records: Vec<Record> = (0..3).map(record).collect();
        let bytes = file(&records);
        let (read, damage) = decode_all(&bytes[..bytes.len() - 5]);
        assert_eq!(read, records[..2]);
        assert_eq!(damage.len(), 1);
        assert_eq!(damage[0].reason, "torn record body");
    }

    #[test]
    fn a_corrupt_record_in_the_middle_does_not_hide_the_next_ones() {
        let records: Vec<Record> = (0..3).map(record).collect();
        let mut bytes = file(&records[..1]);
        let second_at = bytes.len();
        bytes.extend(file(&records[1..]));
        bytes[second_at + 20] ^= 0xFF; // flip a body byte of the second record
        let (read, damage) = decode_all(&bytes);
        assert_eq!(read, vec![records[0].clone(), records[2].clone()]);
        assert_eq!(damage[0].reason, "checksum mismatch");
    }

    #[test]
    fn garbage_alone_yields_nothing() {
        let (read, damage) = decode_all(b"not a spool file at all");
        assert!(read.is_empty());
        assert_eq!(damage.len(), 1);
    }

    #[test]
    fn records_are_read_a_batch_at_a_time_and_resume_where_they_stopped() {
        let records: Vec<Record> = (0..5).map(record).collect();
        let bytes = file(&records);
        let (first, damage, at) = decode_some(&bytes, 0, 2);
        assert_eq!(first, records[..2]);
        assert!(damage.is_empty());
        let (rest, _, end) = decode_some(&bytes, at, 10);
        assert_eq!(rest, records[2..]);
        assert_eq!(end, bytes.len());
        let (none, _, end_again) = decode_some(&bytes, end, 10);
        assert!(none.is_empty());
        assert_eq!(end_again, bytes.len());
    }
}
