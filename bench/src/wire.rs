//! The wire suite (`--suites wire`): the same rows pushed as JSON, as `QPB1` (reference 2.x
//! §2.9.1, flag 4: what the 2.x client sends with `binary_push`) and as `QPB1` with push
//! compression (§2.9.2, flag 8: stored-format frames, one zstd frame per group), then popped and
//! acked as JSON and as framed `QPF1` answers (§2.10, `frames=true`), in one run, each variant on
//! a fresh database with its own broker, the order rotated every round. Reported per variant:
//! msg/s, the broker's and PostgreSQL's CPU µs per message, bytes on the wire per message; and
//! per round the ratio against the JSON variant of the same direction (the report gives the
//! median of those ratios).
//!
//! Also home of the bench's own `QPB1` encoder ([`PushEncoder`]) and `QPF1` decoder
//! ([`decode_framed`]), written from the reference, not from the broker's code, and tested
//! against the broker's decoder and encoder; and of a consumer loop that pops either way, in
//! queue mode or in a consumer group ([`consumers`], also used by the fan-out suite).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::broker::BrokerProcess;
use crate::data::{self, Rng};
use crate::db::{self, Server};
use crate::http::HttpConn;
use crate::measure::{median, CpuTargets, CpuUse, Window, WorkerStats};
use crate::scenario::{trace, Params, POP_BATCH};
use crate::{load, traffic, BoxError};

/// Items per push of the suite (as the push suite's batch-100 row).
pub const PUSH_BATCH: usize = 100;
/// Partitions written (as the push and consume suites).
pub const PARTITIONS: u64 = 100;
/// Content type of the binary push bodies.
pub const PUSH_CONTENT_TYPE: &str = "application/x-queen-push";

/// One way of moving the same messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// `POST /api/v1/push`, `{"items": [...]}`.
    PushJson,
    /// `QPB1`, flag 4 (every item with its transaction id), uncompressed.
    PushQpb1,
    /// `QPB1`, flag 8: stored-format frames with client-minted message ids, zstd per group.
    PushQpb1Zstd,
    /// Pop (batch 100, no long poll) + `/ack/batch`, JSON answers.
    PopJson,
    /// The same with `frames=true`: `QPF1` answers.
    PopFramed,
}

impl Variant {
    /// Every variant, in the order of the first round.
    pub const ALL: [Variant; 5] = [
        Variant::PushJson,
        Variant::PushQpb1,
        Variant::PushQpb1Zstd,
        Variant::PopJson,
        Variant::PopFramed,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Variant::PushJson => "push JSON",
            Variant::PushQpb1 => "push QPB1",
            Variant::PushQpb1Zstd => "push QPB1+zstd (flag 8)",
            Variant::PopJson => "pop+ack JSON",
            Variant::PopFramed => "pop+ack framed QPF1",
        }
    }

    /// The JSON variant this one is compared with.
    pub fn baseline(self) -> Variant {
        if self.is_push() {
            Variant::PushJson
        } else {
            Variant::PopJson
        }
    }

    fn is_push(self) -> bool {
        matches!(
            self,
            Variant::PushJson | Variant::PushQpb1 | Variant::PushQpb1Zstd
        )
    }
}

/// The variants of round `round`: [`Variant::ALL`] rotated by the round, so no variant always
/// runs first (or last) on a machine whose load drifts.
pub fn round_order(round: usize) -> Vec<Variant> {
    let mut v = Variant::ALL.to_vec();
    let n = v.len();
    v.rotate_left(round % n);
    v
}

/// How the bodies of a push are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushBody {
    /// JSON.
    Json,
    /// `QPB1` flag 4.
    Qpb1,
    /// `QPB1` flag 8.
    Qpb1Frames,
}

/// Writes push bodies of one partition's items, reusing its buffers. The items are those of
/// [`data::push_body`]: transaction ids `transaction_id(tag, conn, seq)`, random base64 payloads
/// as JSON strings.
pub struct PushEncoder {
    body: PushBody,
    out: Vec<u8>,
    frames: Vec<u8>,
    json: String,
    payload: String,
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).expect("queue, partition and ids fit a str16");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    let n = u32::try_from(n).expect("lengths fit a u32");
    out.extend_from_slice(&n.to_le_bytes());
}

/// A version-7 message id as the 2.x client mints them (§2.9.2): the group's 48-bit millisecond
/// stamp, then random bits with the version and variant set.
fn message_id(ms: u64, rng: &mut Rng) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    id[6..14].copy_from_slice(&rng.next_u64().to_le_bytes());
    id[14..].copy_from_slice(&rng.next_u64().to_le_bytes()[..2]);
    id[6] = (id[6] & 0x0F) | 0x70;
    id[8] = (id[8] & 0x3F) | 0x80;
    id
}

impl PushEncoder {
    /// An encoder of `body`s.
    pub fn new(body: PushBody) -> Self {
        Self {
            body,
            out: Vec::with_capacity(64 * 1024),
            frames: Vec::with_capacity(64 * 1024),
            json: String::with_capacity(64 * 1024),
            payload: String::with_capacity(data::PAYLOAD_CHARS + 2),
        }
    }

    /// The content type of the bodies.
    pub fn content_type(&self) -> &'static str {
        match self.body {
            PushBody::Json => "application/json",
            PushBody::Qpb1 | PushBody::Qpb1Frames => PUSH_CONTENT_TYPE,
        }
    }

    /// One push request of `batch` items to `partition`; `seq` counts on across calls.
    pub fn encode(
        &mut self,
        partition: &str,
        batch: usize,
        (tag, conn): (u64, usize),
        seq: &mut u64,
        rng: &mut Rng,
    ) -> &[u8] {
        if self.body == PushBody::Json {
            data::push_body(&mut self.json, partition, batch, (tag, conn), seq, rng);
            return self.json.as_bytes();
        }
        self.out.clear();
        self.out.extend_from_slice(b"QPB1");
        let frames = self.body == PushBody::Qpb1Frames;
        self.out.push(if frames { 8 } else { 4 });
        put_u32(&mut self.out, 1);
        put_str16(&mut self.out, data::QUEUE);
        put_str16(&mut self.out, partition);
        put_u32(&mut self.out, batch);
        let ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
        self.frames.clear();
        for _ in 0..batch {
            let txn = data::transaction_id(tag, conn, *seq);
            *seq += 1;
            self.payload.clear();
            data::push_payload(&mut self.payload, rng);
            if frames {
                put_u32(
                    &mut self.frames,
                    1 + 16 + 2 + txn.len() + self.payload.len(),
                );
                self.frames.push(0);
                self.frames.extend_from_slice(&message_id(ms, rng));
                put_str16(&mut self.frames, &txn);
                self.frames.extend_from_slice(self.payload.as_bytes());
            } else {
                put_str16(&mut self.out, &txn);
                put_u32(&mut self.out, self.payload.len());
                self.out.extend_from_slice(self.payload.as_bytes());
            }
        }
        if frames {
            // One-shot compression writes the content size, as the client's does.
            let z = zstd::bulk::compress(&self.frames, 1).expect("zstd compresses a buffer");
            put_u32(&mut self.out, z.len());
            self.out.extend_from_slice(&z);
        }
        &self.out
    }
}

/// One message of a framed pop answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FramedMessage {
    /// The partition's id (decimal text in the ack).
    pub partition_id: u64,
    /// Offset in the partition.
    pub offset: u64,
    /// Message id, RFC byte order.
    pub id: [u8; 16],
    /// Transaction id.
    pub transaction_id: String,
    /// Payload (JSON text).
    pub payload: String,
}

/// A decoded `QPF1` answer: what an ack needs, and the messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Framed {
    /// The answer's own JSON keys (may be empty).
    pub own: String,
    /// Queue.
    pub queue: String,
    /// Lease id ("" without one).
    pub lease_id: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Claims in the answer.
    pub claims: u32,
    /// Delivered messages (those inside each claim's range), in order.
    pub messages: Vec<FramedMessage>,
}

/// Bounds-checked little-endian reads.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| format!("{what} truncated at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn str16(&mut self, what: &str) -> Result<&'a str, String> {
        let n = self.u16(what)? as usize;
        std::str::from_utf8(self.take(n, what)?).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// Decodes one record's frames (§2.10): message `i` has offset `base + i` and is kept only
/// inside `start..=end`.
fn decode_frames(
    frames: &[u8],
    count: u32,
    (partition_id, base, start, end): (u64, u64, u64, u64),
    out: &mut Vec<FramedMessage>,
) -> Result<(), String> {
    let mut r = Reader {
        bytes: frames,
        at: 0,
    };
    for i in 0..u64::from(count) {
        let len = r.u32("frame length")? as usize;
        let mut f = Reader {
            bytes: r.take(len, "frame")?,
            at: 0,
        };
        let flags = f.u8("frame flags")?;
        if flags & 4 != 0 || flags & !7 != 0 {
            return Err(format!("frame flags {flags:#x} not readable"));
        }
        let id = f.array::<16>("message id")?;
        if flags & 1 != 0 {
            f.take(16, "trace id")?;
        }
        let txn = f.str16("transaction id")?;
        if flags & 2 != 0 {
            f.str16("producer")?;
        }
        let payload = std::str::from_utf8(&f.bytes[f.at..])
            .map_err(|_| "payload is not UTF-8".to_string())?;
        let offset = base + i;
        if (start..=end).contains(&offset) {
            out.push(FramedMessage {
                partition_id,
                offset,
                id,
                transaction_id: txn.to_string(),
                payload: payload.to_string(),
            });
        }
    }
    if !r.done() {
        return Err("bytes after a record's frames".into());
    }
    Ok(())
}

/// Decodes a `QPF1` answer (reference 2.x §2.10).
///
/// # Errors
///
/// A text naming what is wrong: another magic, an unknown version or codec, an encrypted
/// frame, truncation.
pub fn decode_framed(bytes: &[u8]) -> Result<Framed, String> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4, "magic")? != b"QPF1" {
        return Err("not a QPF1 answer".into());
    }
    let mut out = Framed::default();
    match r.u8("version")? {
        0 => {}
        1 => {
            let n = r.u32("own length")? as usize;
            out.own = std::str::from_utf8(r.take(n, "own keys")?)
                .map_err(|_| "own keys are not UTF-8".to_string())?
                .to_string();
        }
        v => return Err(format!("unknown version {v}")),
    }
    out.queue = r.str16("queue")?.to_string();
    out.lease_id = r.str16("lease id")?.to_string();
    out.consumer_group = r.str16("consumer group")?.to_string();
    out.claims = r.u32("claims")?;
    let mut raw = Vec::new();
    for _ in 0..out.claims {
        let partition_id = r.u64("partition id")?;
        r.str16("partition")?;
        let (start, end) = (r.u64("start")?, r.u64("end")?);
        r.u32("delivery attempt")?;
        let records = r.u32("records")?;
        for _ in 0..records {
            let base = r.u64("base offset")?;
            r.u64("created at")?;
            let count = r.u32("record count")?;
            let codec = r.u8("codec")?;
            let len = r.u32("record length")? as usize;
            let stored = r.take(len, "record")?;
            let frames = match codec {
                0 => stored,
                1 => {
                    raw.clear();
                    zstd::stream::copy_decode(stored, &mut raw)
                        .map_err(|e| format!("zstd record: {e}"))?;
                    &raw[..]
                }
                c => return Err(format!("unknown codec {c}")),
            };
            decode_frames(
                frames,
                count,
                (partition_id, base, start, end),
                &mut out.messages,
            )?;
        }
    }
    if !r.done() {
        return Err("bytes after the last claim".into());
    }
    Ok(out)
}

/// A JSON pop answer's message: what an ack needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonMessage<'a> {
    transaction_id: &'a str,
    partition_id: &'a str,
    lease_id: Option<&'a str>,
}

#[derive(Deserialize)]
struct JsonPop<'a> {
    #[serde(borrow)]
    messages: Vec<JsonMessage<'a>>,
}

/// Appends one acknowledgement (status completed) to an `/ack/batch` body being written.
fn put_ack(ack: &mut String, first: bool, txn: &str, partition_id: &str, lease: &str) {
    if !first {
        ack.push(',');
    }
    ack.push_str("{\"transactionId\":\"");
    ack.push_str(txn);
    ack.push_str("\",\"partitionId\":\"");
    ack.push_str(partition_id);
    ack.push_str("\",\"leaseId\":\"");
    ack.push_str(lease);
    ack.push_str("\",\"status\":\"completed\"}");
}

fn ack_head(ack: &mut String) {
    ack.clear();
    ack.push_str("{\"acknowledgments\":[");
}

fn ack_tail(ack: &mut String, group: Option<&str>) {
    match group {
        Some(g) => {
            ack.push_str("],\"consumerGroup\":\"");
            ack.push_str(g);
            ack.push_str("\"}");
        }
        None => ack.push_str("],\"consumerGroup\":null}"),
    }
}

/// Writes into `ack` the `/ack/batch` body completing every message of the pop answer `body`
/// (JSON or `QPF1`, told by its first bytes, as the client does); returns the messages.
///
/// # Errors
///
/// When `body` is neither answer.
pub fn ack_for(body: &[u8], group: Option<&str>, ack: &mut String) -> Result<usize, String> {
    ack_head(ack);
    let n = if body.starts_with(b"QPF1") {
        let f = decode_framed(body)?;
        let mut id = String::new();
        for (k, m) in f.messages.iter().enumerate() {
            id.clear();
            id.push_str(&m.partition_id.to_string());
            put_ack(ack, k == 0, &m.transaction_id, &id, &f.lease_id);
        }
        f.messages.len()
    } else {
        let p: JsonPop = serde_json::from_slice(body).map_err(|e| format!("pop answer: {e}"))?;
        for (k, m) in p.messages.iter().enumerate() {
            put_ack(
                ack,
                k == 0,
                m.transaction_id,
                m.partition_id,
                m.lease_id.unwrap_or(""),
            );
        }
        p.messages.len()
    };
    ack_tail(ack, group);
    Ok(n)
}

/// How the consumers pop.
#[derive(Clone, Debug)]
pub struct PopOptions {
    /// `frames=true`.
    pub framed: bool,
    /// `consumerGroup=` (with `subscriptionMode=all`), else queue mode.
    pub group: Option<String>,
    /// Long poll (`wait=true&timeout=1000`), else `wait=false` with a 2 ms pause after an empty
    /// answer.
    pub wait: bool,
    /// Messages per pop.
    pub batch: usize,
    /// `autopilot=true` (the 2.6 client's default): the broker sizes batch and partitions per
    /// pop.
    pub autopilot: bool,
}

impl PopOptions {
    fn path(&self) -> String {
        let mut p = format!("/api/v1/pop/queue/{}?batch={}", data::QUEUE, self.batch);
        p.push_str(if self.wait {
            "&wait=true&timeout=1000"
        } else {
            "&wait=false"
        });
        if let Some(g) = &self.group {
            p.push_str(&format!("&consumerGroup={g}&subscriptionMode=all"));
        }
        if self.framed {
            p.push_str("&frames=true");
        }
        if self.autopilot {
            p.push_str("&autopilot=true");
        }
        p
    }
}

/// What one consumer did.
#[derive(Default)]
pub struct ConsumerStats {
    /// Messages popped and acked (ack answered) inside the window, and their cycles.
    pub window: WorkerStats,
    /// Bytes of pop answers inside the window.
    pub answer_bytes: u64,
    /// Answers that were framed (`QPF1`).
    pub framed_answers: u64,
    /// Empty answers.
    pub empty: u64,
    /// Acks answered `success: false`.
    pub ack_failures: u64,
}

/// Starts `n` consumers popping as `opts` says + acking every message, until `stop`;
/// `delivered` counts acked messages of all of them.
pub fn consumers(
    port: u16,
    n: usize,
    opts: &PopOptions,
    window: Window,
    stop: Arc<AtomicBool>,
    delivered: Arc<AtomicU64>,
) -> Vec<JoinHandle<ConsumerStats>> {
    let path = opts.path();
    (0..n)
        .map(|_| {
            let (path, stop, delivered) = (path.clone(), stop.clone(), delivered.clone());
            let (group, wait) = (opts.group.clone(), opts.wait);
            tokio::spawn(async move {
                let mut s = ConsumerStats::default();
                let mut conn = HttpConn::new(port);
                let mut ack = String::with_capacity(POP_BATCH * 160 + 64);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = match conn.request("GET", &path, b"").await {
                        Ok(r) if r.status == 200 || r.status == 204 => r,
                        Ok(r) => {
                            s.window.error(format!(
                                "pop answered {}: {}",
                                r.status,
                                String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                            ));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                        Err(e) => {
                            s.window.error(format!("pop: {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let got = if r.status == 204 {
                        Ok(0)
                    } else {
                        ack_for(&r.body, group.as_deref(), &mut ack)
                    };
                    let got = match got {
                        Ok(got) => got,
                        Err(e) => {
                            s.window.error(e);
                            continue;
                        }
                    };
                    if got == 0 {
                        s.empty += 1;
                        if !wait {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        continue;
                    }
                    if window.contains(Instant::now()) {
                        s.answer_bytes += r.body.len() as u64;
                        s.framed_answers += u64::from(r.body.starts_with(b"QPF1"));
                    }
                    match conn
                        .request("POST", "/api/v1/ack/batch", ack.as_bytes())
                        .await
                    {
                        Ok(a) if a.status == 200 => {
                            let ok = traffic::acked_ok(&a.body);
                            s.ack_failures += got.saturating_sub(ok) as u64;
                            s.window.record(&window, started, got as u64);
                            delivered.fetch_add(got as u64, Ordering::Relaxed);
                        }
                        Ok(a) => s.window.error(format!(
                            "ack answered {}: {}",
                            a.status,
                            String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
                        )),
                        Err(e) => s.window.error(format!("ack: {e}")),
                    }
                }
                s
            })
        })
        .collect()
}

/// Starts `connections` push workers writing `body`s of `batch` items to random partitions
/// among `partitions` until the window ends.
pub fn push_workers(
    port: u16,
    connections: usize,
    body: PushBody,
    batch: usize,
    window: Window,
    tag: u64,
    bytes: Arc<AtomicU64>,
) -> Vec<JoinHandle<WorkerStats>> {
    let names: Arc<Vec<String>> = Arc::new((0..PARTITIONS).map(data::partition_name).collect());
    (0..connections)
        .map(|c| {
            let (names, bytes) = (names.clone(), bytes.clone());
            tokio::spawn(async move {
                let mut stats = WorkerStats::default();
                let mut conn = HttpConn::new(port);
                let mut rng = Rng::new(tag ^ ((c as u64) << 32));
                let mut enc = PushEncoder::new(body);
                let mut seq = 0u64;
                while Instant::now() < window.end {
                    let partition = &names[rng.below(names.len() as u64) as usize];
                    let content_type = enc.content_type();
                    let b = enc.encode(partition, batch, (tag, c), &mut seq, &mut rng);
                    let started = Instant::now();
                    let sent = b.len() as u64;
                    match conn
                        .request_as("POST", "/api/v1/push", content_type, b)
                        .await
                    {
                        Ok(r) if r.status == 201 => {
                            let queued = traffic::verdicts(&r.body)
                                .iter()
                                .filter(|v| **v == traffic::Verdict::Queued)
                                .count() as u64;
                            stats.not_queued += batch as u64 - queued.min(batch as u64);
                            if window.contains(Instant::now()) {
                                bytes.fetch_add(sent, Ordering::Relaxed);
                            }
                            stats.record(&window, started, queued);
                        }
                        Ok(r) => {
                            stats.error(format!(
                                "HTTP {}: {}",
                                r.status,
                                String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                            ));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(e) => {
                            stats.error(format!("push: {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                stats
            })
        })
        .collect()
}

/// One variant measured once.
#[derive(Clone, Debug, Serialize)]
pub struct WireMeasurement {
    /// What.
    pub variant: Variant,
    /// Round (from 0).
    pub round: usize,
    /// Messages pushed (queued) or popped and acked per second in the window.
    pub msgs_per_sec: f64,
    /// Request latency (push) or pop+ack cycle, p50 and p99, ms.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// Cores used in the window.
    pub cpu: CpuUse,
    /// The broker's CPU per message, µs.
    pub broker_us_per_msg: f64,
    /// PostgreSQL's CPU per message, µs.
    pub postgres_us_per_msg: f64,
    /// Request bytes (push) or answer bytes (pop) per message.
    pub bytes_per_msg: f64,
    /// Failed requests.
    pub errors: u64,
    /// What went wrong (errors, items not queued, answers not framed, a queue run dry).
    pub problems: Vec<String>,
}

/// Waits through `window` and returns the cores each party used in it (counters read at both
/// ends).
pub async fn cpu_between(targets: CpuTargets, window: Window, ticks_per_sec: f64) -> CpuUse {
    tokio::time::sleep_until(window.start.into()).await;
    let (c0, t0) = (targets.snapshot(), Instant::now());
    tokio::time::sleep_until(window.end.into()).await;
    let c1 = targets.snapshot();
    CpuUse::between(&c0, &c1, t0.elapsed().as_secs_f64(), ticks_per_sec)
}

/// Measures `variant` once, on a fresh database with its own broker.
///
/// # Errors
///
/// When setup fails (failing requests inside the window are counted, not fatal).
pub async fn measure(
    server: &mut Server,
    params: &Params,
    variant: Variant,
    round: usize,
) -> Result<WireMeasurement, BoxError> {
    let name = server.create_database().await?;
    let url = server.url(&name);
    let result = measure_in(server, params, variant, round, &url).await;
    server.drop_database(&name).await?;
    result
}

async fn measure_in(
    server: &mut Server,
    params: &Params,
    variant: Variant,
    round: usize,
    url: &str,
) -> Result<WireMeasurement, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    db::setup_queue(&mut conn, PARTITIONS, true).await?;
    conn.close().await?;
    let t = Instant::now();
    let broker = BrokerProcess::start(&params.broker_bin, url, &params.broker_env).await?;
    trace(params, "broker start", t);
    load::prime(broker.port, PARTITIONS, params.connections).await?;
    let tag = data::fresh_seed();
    let mut prefilled = 0;
    if !variant.is_push() {
        let t = Instant::now();
        let logs = traffic::fill(
            broker.port,
            params.connections,
            PUSH_BATCH,
            PARTITIONS,
            tag,
            params.prefill,
        )
        .await;
        prefilled = logs
            .iter()
            .flat_map(|l| &l.requests)
            .map(|r| u64::from(r.queued))
            .sum::<u64>();
        trace(params, "fill", t);
    }
    server.checkpoint().await?;
    let targets = CpuTargets {
        broker: Some(broker.pid()),
        postmaster: server.postmaster,
    };
    let window = Window::after(params.warmup, params.duration);
    let bytes = Arc::new(AtomicU64::new(0));
    let mut problems = Vec::new();
    let (stats, cpu, bytes_total) = if variant.is_push() {
        let body = match variant {
            Variant::PushQpb1 => PushBody::Qpb1,
            Variant::PushQpb1Zstd => PushBody::Qpb1Frames,
            _ => PushBody::Json,
        };
        let workers = push_workers(
            broker.port,
            params.connections,
            body,
            PUSH_BATCH,
            window,
            tag,
            bytes.clone(),
        );
        let cpu = cpu_between(targets, window, params.ticks_per_sec).await;
        let mut all = Vec::new();
        for w in workers {
            all.push(w.await?);
        }
        let stats = WorkerStats::merge(all);
        if stats.not_queued > 0 {
            problems.push(format!("{} items not queued", stats.not_queued));
        }
        (stats, cpu, bytes.load(Ordering::Relaxed))
    } else {
        let opts = PopOptions {
            framed: variant == Variant::PopFramed,
            group: None,
            wait: false,
            batch: POP_BATCH,
            autopilot: false,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let delivered = Arc::new(AtomicU64::new(0));
        let workers = consumers(
            broker.port,
            params.consumers,
            &opts,
            window,
            stop.clone(),
            delivered.clone(),
        );
        let cpu = cpu_between(targets, window, params.ticks_per_sec).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        let (mut answer_bytes, mut framed, mut empty, mut failures) = (0, 0, 0, 0);
        for w in workers {
            let s = w.await?;
            answer_bytes += s.answer_bytes;
            framed += s.framed_answers;
            empty += s.empty;
            failures += s.ack_failures;
            all.push(s.window);
        }
        let stats = WorkerStats::merge(all);
        if opts.framed && framed < stats.ops {
            problems.push(format!(
                "{} of {} answers in the window were JSON",
                stats.ops - framed,
                stats.ops
            ));
        }
        if failures > 0 {
            problems.push(format!("{failures} acks not successful"));
        }
        if delivered.load(Ordering::Relaxed) + 1_000 >= prefilled {
            problems.push(format!(
                "the queue ran dry ({} of {prefilled} consumed, {empty} empty pops): raise --prefill",
                delivered.load(Ordering::Relaxed)
            ));
        }
        (stats, cpu, answer_bytes)
    };
    let problems_of_broker = broker.log_problems(3);
    broker.stop();
    let msgs_per_sec = stats.msgs as f64 / window.secs();
    if let Some(e) = &stats.first_error {
        problems.push(format!("{} errors, first: {e}", stats.errors));
    }
    problems.extend(problems_of_broker);
    let per_msg = |cores: f64| cores * 1e6 / msgs_per_sec;
    Ok(WireMeasurement {
        variant,
        round,
        msgs_per_sec,
        p50_ms: stats.percentile_ms(50.0),
        p99_ms: stats.percentile_ms(99.0),
        cpu,
        broker_us_per_msg: per_msg(cpu.broker),
        postgres_us_per_msg: per_msg(cpu.postgres),
        bytes_per_msg: bytes_total as f64 / stats.msgs.max(1) as f64,
        errors: stats.errors,
        problems,
    })
}

/// Median and range of one figure over the rounds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `values` (NaNs left out).
    pub fn of(values: &[f64]) -> Self {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        Self {
            median: median(&finite),
            min: finite.iter().copied().fold(f64::NAN, f64::min),
            max: finite.iter().copied().fold(f64::NAN, f64::max),
        }
    }

    /// `median (min–max)` with `digits` decimals.
    pub fn text(&self, digits: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median,
            self.min,
            self.max,
            d = digits
        )
    }
}

/// One variant over all rounds.
#[derive(Clone, Debug, Serialize)]
pub struct WireRow {
    /// What.
    pub variant: Variant,
    /// Rounds measured.
    pub rounds: usize,
    /// msg/s.
    pub msgs_per_sec: Spread,
    /// Broker CPU µs per message.
    pub broker_us_per_msg: Spread,
    /// PostgreSQL CPU µs per message.
    pub postgres_us_per_msg: Spread,
    /// Bytes on the wire per message (request for pushes, answer for pops).
    pub bytes_per_msg: Spread,
    /// p50 of the request (push) or pop+ack cycle, ms.
    pub p50_ms: Spread,
    /// Per-round msg/s against the JSON variant of the same round.
    pub rate_ratio: Spread,
    /// Per-round broker CPU per message against the JSON variant of the same round.
    pub broker_cpu_ratio: Spread,
}

/// The rows of every variant measured, with per-round ratios.
pub fn rows(all: &[WireMeasurement]) -> Vec<WireRow> {
    Variant::ALL
        .iter()
        .filter_map(|&v| {
            let mine: Vec<&WireMeasurement> = all.iter().filter(|m| m.variant == v).collect();
            if mine.is_empty() {
                return None;
            }
            let of = |f: fn(&WireMeasurement) -> f64| {
                Spread::of(&mine.iter().map(|m| f(m)).collect::<Vec<_>>())
            };
            let ratio = |f: fn(&WireMeasurement) -> f64| {
                let r: Vec<f64> = mine
                    .iter()
                    .filter_map(|m| {
                        all.iter()
                            .find(|b| b.variant == v.baseline() && b.round == m.round)
                            .map(|b| f(m) / f(b))
                    })
                    .collect();
                Spread::of(&r)
            };
            Some(WireRow {
                variant: v,
                rounds: mine.len(),
                msgs_per_sec: of(|m| m.msgs_per_sec),
                broker_us_per_msg: of(|m| m.broker_us_per_msg),
                postgres_us_per_msg: of(|m| m.postgres_us_per_msg),
                bytes_per_msg: of(|m| m.bytes_per_msg),
                p50_ms: of(|m| m.p50_ms),
                rate_ratio: ratio(|m| m.msgs_per_sec),
                broker_cpu_ratio: ratio(|m| m.broker_us_per_msg),
            })
        })
        .collect()
}

/// The goals of issue 35 read from the rows: (what, median ratio, met).
pub fn goals(rows: &[WireRow]) -> Vec<(String, f64, bool)> {
    let mut out = Vec::new();
    for r in rows {
        match r.variant {
            Variant::PushQpb1 | Variant::PushQpb1Zstd => {
                let x = r.broker_cpu_ratio.median;
                out.push((
                    format!("{}: broker CPU/msg ≤ 0.6× JSON", r.variant.label()),
                    x,
                    x <= 0.6,
                ));
            }
            Variant::PopFramed => {
                let x = r.rate_ratio.median;
                out.push((
                    format!("{}: msg/s ≥ 1.3× JSON", r.variant.label()),
                    x,
                    x >= 1.3,
                ));
            }
            Variant::PushJson | Variant::PopJson => {}
        }
    }
    out
}

/// The suite's table, medians with (min–max) over the rounds.
pub fn table(rows: &[WireRow]) -> String {
    let mut s = format!(
        "{:<26} {:>22} {:>20} {:>18} {:>18} {:>16} {:>18} {:>18}\n",
        "variant",
        "msg/s",
        "broker µs/msg",
        "PG µs/msg",
        "bytes/msg",
        "p50 ms",
        "rate × JSON",
        "broker CPU × JSON"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<26} {:>22} {:>20} {:>18} {:>18} {:>16} {:>18} {:>18}\n",
            r.variant.label(),
            r.msgs_per_sec.text(0),
            r.broker_us_per_msg.text(1),
            r.postgres_us_per_msg.text(1),
            r.bytes_per_msg.text(0),
            r.p50_ms.text(1),
            r.rate_ratio.text(2),
            r.broker_cpu_ratio.text(2)
        ));
    }
    for (what, x, met) in goals(rows) {
        s.push_str(&format!(
            "goal {what}: {x:.2} {}\n",
            if met { "met" } else { "MISSED" }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_broker::protocol::{pop_framed, push_binary};

    fn pushed(body: PushBody) -> (Vec<u8>, Vec<String>) {
        let mut enc = PushEncoder::new(body);
        let mut rng = Rng::new(9);
        let mut seq = 5;
        let bytes = enc
            .encode("p00042", 3, (0xABCD, 7), &mut seq, &mut rng)
            .to_vec();
        assert_eq!(seq, 8);
        let txns = (5..8).map(|s| data::transaction_id(0xABCD, 7, s)).collect();
        (bytes, txns)
    }

    #[test]
    fn the_qpb1_bodies_decode_in_the_broker_as_written() {
        for body in [PushBody::Qpb1, PushBody::Qpb1Frames] {
            let (bytes, txns) = pushed(body);
            let got = push_binary::decode_push(&bytes, 1 << 20).expect("the broker decodes it");
            assert!(!got.counts);
            assert_eq!(got.items.len(), 3);
            for (item, txn) in got.items.iter().zip(&txns) {
                assert_eq!(
                    (item.queue.as_str(), item.partition.as_str()),
                    (data::QUEUE, "p00042")
                );
                assert_eq!(item.transaction_id.as_deref(), Some(txn.as_str()));
                assert_eq!(item.payload.len(), data::PAYLOAD_CHARS + 2);
                let id = item.message_id;
                assert_eq!(id.is_some(), body == PushBody::Qpb1Frames, "{body:?}");
                if let Some(id) = id {
                    assert_eq!(id.get_version_num(), 7);
                    assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
                }
            }
        }
        let (json, _) = pushed(PushBody::Json);
        let v: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        assert_eq!(v["items"].as_array().map(Vec::len), Some(3));
    }

    fn message(offset: u64, txn: &str, at: i64) -> pop_framed::Message<'_> {
        pop_framed::Message {
            offset,
            id: uuid::Uuid::now_v7(),
            trace_id: (offset == 11).then(uuid::Uuid::new_v4),
            transaction_id: txn,
            producer_sub: (offset == 12).then_some("alice"),
            payload: "{\"n\":1}",
            created_at_micros: at,
        }
    }

    #[test]
    fn framed_answers_of_the_broker_decode_and_ack() {
        let messages = vec![
            message(10, "t10", 1),
            message(11, "t11", 1),
            message(12, "t12", 2),
        ];
        let answer = pop_framed::Answer {
            own: "{\"autopilot\":{\"batch\":3}}",
            queue: "bench",
            lease_id: "lease-1",
            consumer_group: "__QUEUE_MODE__",
            claims: vec![
                pop_framed::Claim {
                    partition_id: 77,
                    partition: "p00001",
                    start: 10,
                    end: 12,
                    delivery_attempt: 1,
                    records: pop_framed::Records::Messages(messages.clone()),
                },
                pop_framed::Claim {
                    partition_id: 78,
                    partition: "p00002",
                    start: 0,
                    end: 0,
                    delivery_attempt: 2,
                    records: pop_framed::Records::Messages(vec![message(0, "u0", 5)]),
                },
            ],
        };
        for compress in [false, true] {
            let bytes = pop_framed::encode(&answer, compress).expect("encodes");
            let f = decode_framed(&bytes).expect("decodes");
            assert_eq!(
                (f.queue.as_str(), f.lease_id.as_str(), f.claims),
                ("bench", "lease-1", 2)
            );
            assert_eq!(f.own, answer.own);
            let seen: Vec<(u64, u64, &str)> = f
                .messages
                .iter()
                .map(|m| (m.partition_id, m.offset, m.transaction_id.as_str()))
                .collect();
            assert_eq!(
                seen,
                vec![
                    (77, 10, "t10"),
                    (77, 11, "t11"),
                    (77, 12, "t12"),
                    (78, 0, "u0")
                ]
            );
            assert_eq!(f.messages[0].id, *messages[0].id.as_bytes());
            assert!(f.messages.iter().all(|m| m.payload == "{\"n\":1}"));
            let mut ack = String::new();
            assert_eq!(ack_for(&bytes, Some("g1"), &mut ack), Ok(4));
            let v: serde_json::Value = serde_json::from_str(&ack).expect("JSON ack");
            assert_eq!(v["consumerGroup"], "g1");
            assert_eq!(v["acknowledgments"][3]["partitionId"], "78");
            assert_eq!(v["acknowledgments"][0]["leaseId"], "lease-1");
            let cut = &bytes[..bytes.len() - 1];
            assert!(decode_framed(cut).is_err(), "truncation is an error");
        }
    }

    #[test]
    fn messages_outside_a_claims_range_are_not_delivered() {
        let answer = pop_framed::Answer {
            own: "",
            queue: "bench",
            lease_id: "",
            consumer_group: "g",
            claims: vec![pop_framed::Claim {
                partition_id: 1,
                partition: "p",
                start: 11,
                end: 11,
                delivery_attempt: 1,
                records: pop_framed::Records::Messages(vec![
                    message(10, "a", 1),
                    message(11, "b", 1),
                ]),
            }],
        };
        let bytes = pop_framed::encode(&answer, false).expect("encodes");
        let f = decode_framed(&bytes).expect("decodes");
        assert_eq!(f.messages.len(), 1);
        assert_eq!(f.messages[0].transaction_id, "b");
    }

    #[test]
    fn json_answers_ack_the_same_way() {
        let body = br#"{"messages":[{"transactionId":"t","partitionId":"0190","leaseId":"l"}]}"#;
        let mut ack = String::new();
        assert_eq!(ack_for(body, None, &mut ack), Ok(1));
        assert!(ack.ends_with("\"consumerGroup\":null}"), "{ack}");
        assert!(ack_for(b"QPF1\x07", None, &mut ack).is_err());
    }

    #[test]
    fn rounds_rotate_the_variants_and_ratios_pair_rounds() {
        assert_eq!(round_order(0)[0], Variant::PushJson);
        assert_eq!(round_order(1)[0], Variant::PushQpb1);
        assert_eq!(round_order(1).len(), 5);
        let m = |variant, round, rate: f64, us: f64| WireMeasurement {
            variant,
            round,
            msgs_per_sec: rate,
            p50_ms: 1.0,
            p99_ms: 2.0,
            cpu: CpuUse::default(),
            broker_us_per_msg: us,
            postgres_us_per_msg: 1.0,
            bytes_per_msg: 1.0,
            errors: 0,
            problems: Vec::new(),
        };
        let all = vec![
            m(Variant::PushJson, 0, 100.0, 10.0),
            m(Variant::PushQpb1, 0, 150.0, 5.0),
            m(Variant::PushJson, 1, 50.0, 20.0),
            m(Variant::PushQpb1, 1, 100.0, 12.0),
        ];
        let r = rows(&all);
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].rate_ratio.median, 1.75);
        assert_eq!((r[1].rate_ratio.min, r[1].rate_ratio.max), (1.5, 2.0));
        assert!((r[1].broker_cpu_ratio.median - 0.55).abs() < 1e-9);
        let g = goals(&r);
        assert_eq!(g.len(), 1);
        assert!(g[0].2);
    }
}
