//! The framed pop answer `QPF1` (reference 2.x §2.10, docs/binary-wire.md "Framed pop"): what
//! a 2.x client with `framed_pop` asks for with `frames=true` on the pop routes. This module
//! only encodes; it knows nothing of HTTP, leases or storage.
//!
//! ```text
//! "QPF1" u8 version(1) u32 own_len, own (JSON object of the answer's own keys, may be empty)
//! str16 queue, str16 leaseId, str16 consumerGroup, u32 claims
//! claim  := u64 partitionId, str16 partition, u64 start, u64 end, u32 deliveryAttempt, u32 records
//! record := u64 base_offset, i64 created_at_us, u32 count, u8 codec (0 raw, 1 zstd), u32 len, bytes
//! frame  := u32 body_len, u8 flags, [16] message_id, [16] trace_id (flag 1),
//!           str16 transactionId, [str16 producer (flag 2)], payload
//! ```
//! A record's messages share one `created_at_us` (the client renders it per record), so a record
//! is a run of messages at consecutive offsets with the same arrival time. A claim's records are
//! either stored record frames, sent as they are ([`Records::Stored`]: segments in the framed
//! layout, `storage::segments::frames`), or messages framed here ([`Records::Messages`]: segments
//! written before that layout, sealed ones once opened, messages with a trace id); see
//! docs/binary-wire.md, "Stored frames".
//!
//! Served by `http::pop::respond_framed`; the client renders `partitionId` from the u64 as
//! decimal text and acks with it, which the ack routes accept beside the UUID.

use uuid::Uuid;

/// The content type of a framed pop answer.
pub const CONTENT_TYPE: &str = "application/x-queen-pop";
/// First bytes of a framed pop answer.
pub const MAGIC: &[u8; 4] = b"QPF1";
/// The version written: with the own-keys section.
pub const VERSION: u8 = 1;
/// Record codec: frames as they are.
pub const CODEC_RAW: u8 = 0;
/// Record codec: one zstd frame of the frames (with its content size).
pub const CODEC_ZSTD: u8 = 1;
/// A frame's bytes besides its transaction id and payload: length word, flags, message id,
/// trace id, and the two length words of the strings (the producer's is counted with the
/// transaction id's budget; only a size hint).
const FRAME_OVERHEAD: usize = 4 + 1 + 16 + 16 + 2 + 2 + 16;
/// A record's bytes besides its frames: base offset, arrival time, count, codec, length.
const RECORD_HEADER: usize = 8 + 8 + 4 + 1 + 4;
/// Frame flag: a trace id follows the message id.
pub const FRAME_TRACE: u8 = 1;
/// Frame flag: a producer follows the transaction id.
pub const FRAME_PRODUCER: u8 = 2;

/// One delivered message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<'a> {
    /// Its offset in the partition.
    pub offset: u64,
    /// Message id.
    pub id: Uuid,
    /// Trace id; the frame carries 16 bytes, so only a UUID trace id can be framed.
    pub trace_id: Option<Uuid>,
    /// The dedup key.
    pub transaction_id: &'a str,
    /// The producer's `sub`.
    pub producer_sub: Option<&'a str>,
    /// Payload JSON text (opened, when the queue seals payloads).
    pub payload: &'a str,
    /// Arrival time, microseconds since the Unix epoch.
    pub created_at_micros: i64,
}

/// One claimed partition and its delivered messages, in offset order.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim<'a> {
    /// The partition's id as a u64 (the client renders it as decimal text).
    pub partition_id: u64,
    /// Partition name.
    pub partition: &'a str,
    /// First offset of the delivery (inclusive).
    pub start: u64,
    /// Last offset of the delivery (inclusive).
    pub end: u64,
    /// The claim's delivery attempt.
    pub delivery_attempt: u32,
    /// The delivered messages.
    pub records: Records<'a>,
}

/// A claim's delivered messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Records<'a> {
    /// Messages to frame, in offset order.
    Messages(Vec<Message<'a>>),
    /// Record frames as stored, in offset order.
    Stored(Vec<Record<'a>>),
}

impl Records<'_> {
    /// Whether no message is delivered.
    pub fn is_empty(&self) -> bool {
        match self {
            Records::Messages(m) => m.is_empty(),
            Records::Stored(r) => r.iter().all(|r| r.count == 0),
        }
    }
}

/// Record frames as stored: `count` frames (each with its length word, in the layout of the
/// module docs) at consecutive offsets from `base_offset`, of one arrival time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Offset of the first frame.
    pub base_offset: u64,
    /// Arrival time, microseconds since the Unix epoch.
    pub created_at_micros: i64,
    /// Frames in it.
    pub count: u32,
    /// The frames.
    pub frames: &'a [u8],
}

/// A whole framed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer<'a> {
    /// The answer's own keys (the autopilot's choice, a conflation echo): a JSON object's text,
    /// or empty.
    pub own: &'a str,
    /// Queue name.
    pub queue: &'a str,
    /// Lease id; empty when there is none.
    pub lease_id: &'a str,
    /// Consumer group (`__QUEUE_MODE__` in queue mode).
    pub consumer_group: &'a str,
    /// The claims, in delivery order.
    pub claims: Vec<Claim<'a>>,
}

/// A field too long for its length word: the caller answers JSON instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} is too long for a framed pop answer")]
pub struct TooLong(pub &'static str);

fn put_str16(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), TooLong> {
    let len = u16::try_from(s.len()).map_err(|_| TooLong(what))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_u32(out: &mut Vec<u8>, n: usize, what: &'static str) -> Result<(), TooLong> {
    let n = u32::try_from(n).map_err(|_| TooLong(what))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

/// Appends one message's frame.
fn put_frame(out: &mut Vec<u8>, m: &Message<'_>) -> Result<(), TooLong> {
    let flags = if m.trace_id.is_some() { FRAME_TRACE } else { 0 }
        | if m.producer_sub.is_some() {
            FRAME_PRODUCER
        } else {
            0
        };
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(flags);
    out.extend_from_slice(m.id.as_bytes());
    if let Some(trace) = m.trace_id {
        out.extend_from_slice(trace.as_bytes());
    }
    put_str16(out, m.transaction_id, "transactionId")?;
    if let Some(producer) = m.producer_sub {
        put_str16(out, producer, "producerSub")?;
    }
    out.extend_from_slice(m.payload.as_bytes());
    let body_len = u32::try_from(out.len() - len_at - 4).map_err(|_| TooLong("payload"))?;
    out[len_at..len_at + 4].copy_from_slice(&body_len.to_le_bytes());
    Ok(())
}

/// Encodes the answer. A record is a run of messages at consecutive offsets with one arrival
/// time; with `compress` each record's frames are one zstd frame (level 1, content size
/// written) when that is smaller than the frames, else they go raw (the codec byte is per
/// record). One compression context serves the whole answer.
///
/// # Errors
///
/// [`TooLong`] when a field does not fit its length word (the caller then answers JSON).
pub fn encode(answer: &Answer<'_>, compress: bool) -> Result<Vec<u8>, TooLong> {
    // Sized for the frames written raw: one allocation in the common case.
    let payload_bytes: usize = answer
        .claims
        .iter()
        .map(|c| match &c.records {
            Records::Messages(messages) => messages
                .iter()
                .map(|m| FRAME_OVERHEAD + m.transaction_id.len() + m.payload.len())
                .sum::<usize>(),
            Records::Stored(records) => {
                records.iter().map(|r| RECORD_HEADER + r.frames.len()).sum()
            }
        })
        .sum();
    let mut out = Vec::with_capacity(64 + answer.own.len() + payload_bytes);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    put_u32(&mut out, answer.own.len(), "own keys")?;
    out.extend_from_slice(answer.own.as_bytes());
    put_str16(&mut out, answer.queue, "queue")?;
    put_str16(&mut out, answer.lease_id, "leaseId")?;
    put_str16(&mut out, answer.consumer_group, "consumerGroup")?;
    put_u32(&mut out, answer.claims.len(), "claims")?;
    let mut frames = Vec::new();
    // A context that cannot be made (out of memory) only means the records go raw.
    let mut compressor = if compress {
        zstd::bulk::Compressor::new(1).ok()
    } else {
        None
    };
    for claim in &answer.claims {
        out.extend_from_slice(&claim.partition_id.to_le_bytes());
        put_str16(&mut out, claim.partition, "partition")?;
        out.extend_from_slice(&claim.start.to_le_bytes());
        out.extend_from_slice(&claim.end.to_le_bytes());
        out.extend_from_slice(&claim.delivery_attempt.to_le_bytes());
        match &claim.records {
            Records::Messages(messages) => {
                let runs = runs(messages);
                put_u32(&mut out, runs.len(), "records")?;
                for run in runs {
                    frames.clear();
                    for m in run {
                        put_frame(&mut frames, m)?;
                    }
                    let head = Record {
                        base_offset: run[0].offset,
                        created_at_micros: run[0].created_at_micros,
                        count: u32::try_from(run.len()).map_err(|_| TooLong("record count"))?,
                        frames: &frames,
                    };
                    put_record(&mut out, &head, compressor.as_mut())?;
                }
            }
            Records::Stored(records) => {
                put_u32(&mut out, records.len(), "records")?;
                for record in records {
                    put_record(&mut out, record, compressor.as_mut())?;
                }
            }
        }
    }
    Ok(out)
}

/// Appends one record: its frames as one zstd frame when a `compressor` makes them smaller,
/// else as they are.
fn put_record(
    out: &mut Vec<u8>,
    record: &Record<'_>,
    compressor: Option<&mut zstd::bulk::Compressor<'_>>,
) -> Result<(), TooLong> {
    out.extend_from_slice(&record.base_offset.to_le_bytes());
    out.extend_from_slice(&record.created_at_micros.to_le_bytes());
    out.extend_from_slice(&record.count.to_le_bytes());
    let smaller = compressor
        .and_then(|c| c.compress(record.frames).ok())
        .filter(|z| z.len() < record.frames.len());
    if let Some(z) = smaller {
        out.push(CODEC_ZSTD);
        put_u32(out, z.len(), "record")?;
        out.extend_from_slice(&z);
    } else {
        out.push(CODEC_RAW);
        put_u32(out, record.frames.len(), "record")?;
        out.extend_from_slice(record.frames);
    }
    Ok(())
}

/// Splits messages into records: runs at consecutive offsets with one arrival time.
fn runs<'m, 'a>(messages: &'m [Message<'a>]) -> Vec<&'m [Message<'a>]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=messages.len() {
        let cut = i == messages.len()
            || messages[i].offset != messages[i - 1].offset + 1
            || messages[i].created_at_micros != messages[i - 1].created_at_micros;
        if cut {
            out.push(&messages[start..i]);
            start = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of the answer that follows the 2.6 client's decoder (`queen/http/pop_frames.py`)
    /// rule by rule: (offset, id, trace, transactionId, producer, payload, createdAt µs,
    /// partitionId text, deliveryAttempt).
    type Decoded = (
        u64,
        Uuid,
        Option<Uuid>,
        String,
        Option<String>,
        String,
        i64,
        String,
        u32,
    );

    struct In<'a>(&'a [u8], usize);
    impl<'a> In<'a> {
        fn take(&mut self, n: usize) -> &'a [u8] {
            let s = &self.0[self.1..self.1 + n];
            self.1 += n;
            s
        }
        fn u16(&mut self) -> usize {
            u16::from_le_bytes(self.take(2).try_into().unwrap()) as usize
        }
        fn u32(&mut self) -> usize {
            u32::from_le_bytes(self.take(4).try_into().unwrap()) as usize
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.take(8).try_into().unwrap())
        }
        fn text(&mut self) -> String {
            let n = self.u16();
            String::from_utf8(self.take(n).to_vec()).unwrap()
        }
    }

    fn decode(data: &[u8]) -> (String, String, String, String, Vec<Decoded>) {
        let mut a = In(data, 0);
        assert_eq!(a.take(4), MAGIC);
        assert_eq!(a.take(1), [1]);
        let own_len = a.u32();
        let own = String::from_utf8(a.take(own_len).to_vec()).unwrap();
        let (queue, lease, group) = (a.text(), a.text(), a.text());
        let mut out = Vec::new();
        for _ in 0..a.u32() {
            let pid = a.u64().to_string();
            let _partition = a.text();
            let (start, end) = (a.u64(), a.u64());
            let attempt = a.u32() as u32;
            for _ in 0..a.u32() {
                let base = a.u64();
                let created = i64::from_le_bytes(a.take(8).try_into().unwrap());
                let count = a.u32();
                let codec = a.take(1)[0];
                let len = a.u32();
                let raw = a.take(len).to_vec();
                let raw = if codec == 1 {
                    zstd::bulk::decompress(&raw, 1 << 20).unwrap()
                } else {
                    raw
                };
                let mut frames = In(&raw, 0);
                for i in 0..count {
                    let n = frames.u32();
                    let mut f = In(frames.take(n), 0);
                    let flags = f.take(1)[0];
                    let id = Uuid::from_slice(f.take(16)).unwrap();
                    let trace = (flags & 1 != 0).then(|| Uuid::from_slice(f.take(16)).unwrap());
                    let txn = f.text();
                    let producer = (flags & 2 != 0).then(|| f.text());
                    let payload = String::from_utf8(f.0[f.1..].to_vec()).unwrap();
                    let offset = base + i as u64;
                    if offset >= start && offset <= end {
                        out.push((
                            offset,
                            id,
                            trace,
                            txn,
                            producer,
                            payload,
                            created,
                            pid.clone(),
                            attempt,
                        ));
                    }
                }
            }
        }
        assert_eq!(a.1, data.len(), "nothing after the last claim");
        (own, queue, lease, group, out)
    }

    fn message(offset: u64, at: i64, payload: &'static str) -> Message<'static> {
        Message {
            offset,
            id: Uuid::now_v7(),
            trace_id: None,
            transaction_id: "t",
            producer_sub: None,
            payload,
            created_at_micros: at,
        }
    }

    #[test]
    fn an_answer_decodes_as_the_client_decodes_it() {
        for compress in [false, true] {
            let mut m = vec![
                message(5, 1_000, r#"{"a":1}"#),
                message(6, 1_000, "2"),
                message(7, 2_000, "null"),
                message(9, 2_000, r#""é""#),
            ];
            m[1].trace_id = Some(Uuid::new_v4());
            m[2].producer_sub = Some("alice");
            let answer = Answer {
                own: r#"{"autopilot":{"batch":10}}"#,
                queue: "q",
                lease_id: "lease-1",
                consumer_group: "g",
                claims: vec![Claim {
                    partition_id: 42,
                    partition: "p",
                    start: 5,
                    end: 9,
                    delivery_attempt: 1,
                    records: Records::Messages(m.clone()),
                }],
            };
            let bytes = encode(&answer, compress).unwrap();
            let (own, queue, lease, group, got) = decode(&bytes);
            assert_eq!(
                (own.as_str(), queue.as_str(), lease.as_str(), group.as_str()),
                (answer.own, "q", "lease-1", "g")
            );
            assert_eq!(got.len(), 4);
            for (g, m) in got.iter().zip(&m) {
                assert_eq!(g.0, m.offset);
                assert_eq!(g.1, m.id);
                assert_eq!(g.2, m.trace_id);
                assert_eq!(g.3, m.transaction_id);
                assert_eq!(g.4.as_deref(), m.producer_sub);
                assert_eq!(g.5, m.payload);
                assert_eq!(g.6, m.created_at_micros);
                assert_eq!((g.7.as_str(), g.8), ("42", 1));
            }
        }
    }

    /// The codec byte of an answer's last record (the answer ends `codec, u32 len, bytes`).
    fn last_codec(bytes: &[u8]) -> u8 {
        (0..bytes.len() - 5)
            .rev()
            .find(|&i| {
                let len = u32::from_le_bytes(bytes[i + 1..i + 5].try_into().unwrap()) as usize;
                bytes[i] <= CODEC_ZSTD && i + 5 + len == bytes.len()
            })
            .map(|i| bytes[i])
            .expect("a record")
    }

    #[test]
    fn a_record_goes_compressed_only_when_that_makes_it_smaller() {
        let answer = |messages| Answer {
            own: "",
            queue: "q",
            lease_id: "l",
            consumer_group: "g",
            claims: vec![Claim {
                partition_id: 1,
                partition: "p",
                start: 0,
                end: 1,
                delivery_attempt: 1,
                records: Records::Messages(messages),
            }],
        };
        let tiny = answer(vec![message(0, 1, "1")]);
        assert_eq!(last_codec(&encode(&tiny, true).unwrap()), CODEC_RAW);
        let long: &'static str = Box::leak(format!("\"{}\"", "ab".repeat(3000)).into_boxed_str());
        let repetitive = answer(vec![message(0, 1, long), message(1, 1, long)]);
        let bytes = encode(&repetitive, true).unwrap();
        assert_eq!(last_codec(&bytes), CODEC_ZSTD);
        let (_, _, _, _, got) = decode(&bytes);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].5, long);
        assert_eq!(last_codec(&encode(&repetitive, false).unwrap()), CODEC_RAW);
    }

    #[test]
    fn records_are_runs_of_one_arrival_time_at_consecutive_offsets() {
        let m = [
            message(0, 1, "1"),
            message(1, 1, "1"),
            message(2, 2, "1"),
            message(4, 2, "1"),
        ];
        let lens: Vec<usize> = runs(&m).iter().map(|r| r.len()).collect();
        assert_eq!(lens, vec![2, 1, 1]);
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn the_bytes_of_an_empty_answer() {
        let answer = Answer {
            own: "",
            queue: "q",
            lease_id: "",
            consumer_group: "g",
            claims: Vec::new(),
        };
        assert_eq!(
            encode(&answer, true).unwrap(),
            b"QPF1\x01\0\0\0\0\x01\0q\0\0\x01\0g\0\0\0\0".to_vec()
        );
    }

    #[test]
    fn stored_records_go_out_as_they_are_and_decode_as_framed_messages() {
        let mut m = vec![
            message(10, 7, r#"{"a":1}"#),
            message(11, 7, "2"),
            message(12, 7, "null"),
        ];
        m[1].producer_sub = Some("bob");
        let mut frames = Vec::new();
        for x in &m {
            put_frame(&mut frames, x).unwrap();
        }
        let stored = Answer {
            own: "",
            queue: "q",
            lease_id: "l",
            consumer_group: "g",
            claims: vec![Claim {
                partition_id: 3,
                partition: "p",
                start: 11,
                end: 12,
                delivery_attempt: 2,
                records: Records::Stored(vec![Record {
                    base_offset: 10,
                    created_at_micros: 7,
                    count: 3,
                    frames: &frames,
                }]),
            }],
        };
        let bytes = encode(&stored, false).unwrap();
        // The frames are in the answer byte for byte, right after their record header.
        assert!(bytes.ends_with(&frames));
        assert_eq!(last_codec(&bytes), CODEC_RAW);
        let (_, _, _, _, got) = decode(&bytes);
        // The client skips offset 10, outside the claim's range.
        assert_eq!(got.len(), 2);
        for (g, m) in got.iter().zip(&m[1..]) {
            assert_eq!(
                (g.0, g.1, g.4.as_deref(), g.6),
                (m.offset, m.id, m.producer_sub, 7)
            );
            assert_eq!((g.3.as_str(), g.5.as_str()), (m.transaction_id, m.payload));
        }
        // The same frames framed from the messages give the same answer.
        let mut framed = stored.clone();
        framed.claims[0].records = Records::Messages(m.clone());
        assert_eq!(encode(&framed, false).unwrap(), bytes);
    }
}
