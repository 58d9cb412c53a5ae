//! Producers and consumers that keep a log, for the scenarios that check what happened to every
//! message (the spool and the consuming scenarios):
//!
//! - [`producers`]: `POST /api/v1/push` like [`crate::load::push_workers`], but each worker runs
//!   until told to stop and records every request (sent, answered, verdicts) and every item's
//!   verdict by its sequence number, so windows can be cut afterwards and the database checked
//!   item by item.
//! - [`consumers`]: `GET /api/v1/pop/queue/bench?batch=..` then `POST /api/v1/ack/batch` with
//!   every message's (transactionId, partitionId, leaseId), in a loop; records when each message
//!   was popped and when each ack returned. [`consumers_with`] pops as a [`PopStyle`] says
//!   (a fixed batch, or `autopilot=true` with or without honouring the advised `waitMs`) and
//!   also records the `autopilot` echoes.
//!
//! A transaction id is `<tag>-<connection>-<sequence>` (see [`crate::data::transaction_id`]),
//! so a popped or stored message names the producer connection and item it came from.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::data::{self, Rng};
use crate::http::HttpConn;
use crate::scenario::PopStyle;

/// What the broker answered for one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `queued`: committed.
    Queued,
    /// `buffered`: in the spool.
    Buffered,
    /// `duplicate`.
    Duplicate,
    /// `failed`: neither stored nor spooled.
    Failed,
    /// The request failed (I/O error, another status): the outcome is unknown.
    Unknown,
}

impl Verdict {
    fn from_word(w: &[u8]) -> Self {
        match w {
            b"queued" => Self::Queued,
            b"buffered" => Self::Buffered,
            b"duplicate" => Self::Duplicate,
            b"failed" => Self::Failed,
            _ => Self::Unknown,
        }
    }

    /// Whether the broker took responsibility for the item (it must be stored exactly once).
    pub fn acknowledged(self) -> bool {
        matches!(self, Self::Queued | Self::Buffered)
    }
}

/// The `status` of every item of a push response, in order.
pub fn verdicts(body: &[u8]) -> Vec<Verdict> {
    const NEEDLE: &[u8] = b"\"status\":\"";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(pos) = body[at..].windows(NEEDLE.len()).position(|w| w == NEEDLE) {
        let start = at + pos + NEEDLE.len();
        let len = body[start..]
            .iter()
            .position(|&b| b == b'"')
            .unwrap_or(body.len() - start);
        out.push(Verdict::from_word(&body[start..start + len]));
        at = start + len;
    }
    out
}

/// (connection, sequence) of a transaction id minted by [`data::transaction_id`] with `tag`.
pub fn parse_txn(txn: &str, tag: u64) -> Option<(usize, u64)> {
    let b = txn.as_bytes();
    if b.len() != 34 || b[16] != b'-' || b[21] != b'-' {
        return None;
    }
    if u64::from_str_radix(&txn[..16], 16).ok()? != tag {
        return None;
    }
    let conn = usize::from_str_radix(&txn[17..21], 16).ok()?;
    let seq = u64::from_str_radix(&txn[22..], 16).ok()?;
    Some((conn, seq))
}

/// One push request.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// When it was sent.
    pub sent: Instant,
    /// When its answer arrived (or the request failed).
    pub done: Instant,
    /// Items answered `queued`.
    pub queued: u32,
    /// Items answered `buffered`.
    pub buffered: u32,
    /// Items with any other verdict, or of a failed request.
    pub other: u32,
    /// The partition written (its number, see [`crate::data::partition_name`]).
    pub partition: u32,
}

/// Everything one producer connection did. Request `k` carried items `k*batch .. (k+1)*batch`.
#[derive(Default)]
pub struct ProducerLog {
    /// Every request, in order.
    pub requests: Vec<Request>,
    /// Every item's verdict, by sequence number.
    pub verdicts: Vec<Verdict>,
    /// Failed requests.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
}

/// Starts `connections` producers: each pushes `batch` items per request to a random partition
/// among `partitions` until `stop` is set, answers included. With `pace` (msg/s, all producers
/// together) each producer sends its requests on a fixed schedule (never faster; when a request
/// is late the next one goes at once), else as fast as the answers come.
pub fn producers(
    port: u16,
    connections: usize,
    batch: usize,
    partitions: u64,
    tag: u64,
    stop: Arc<AtomicBool>,
    pace: Option<f64>,
) -> Vec<JoinHandle<ProducerLog>> {
    producers_limited(
        &[port],
        connections,
        batch,
        partitions,
        tag,
        stop,
        None,
        pace,
    )
}

/// [`producers`] spread over several brokers: producer `c` talks to `ports[c % ports.len()]`.
pub fn producers_spread(
    ports: &[u16],
    connections: usize,
    batch: usize,
    partitions: u64,
    tag: u64,
    stop: Arc<AtomicBool>,
) -> Vec<JoinHandle<ProducerLog>> {
    producers_limited(ports, connections, batch, partitions, tag, stop, None, None)
}

/// [`producers`] that also stop once `requests` (shared) runs out.
#[allow(clippy::too_many_arguments)]
fn producers_limited(
    ports: &[u16],
    connections: usize,
    batch: usize,
    partitions: u64,
    tag: u64,
    stop: Arc<AtomicBool>,
    requests: Option<Arc<AtomicU64>>,
    pace: Option<f64>,
) -> Vec<JoinHandle<ProducerLog>> {
    let interval = pace
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(connections as f64 * batch as f64 / r));
    let names: Arc<Vec<String>> = Arc::new((0..partitions).map(data::partition_name).collect());
    (0..connections)
        .map(|c| {
            let names = names.clone();
            let stop = stop.clone();
            let requests = requests.clone();
            let port = ports[c % ports.len()];
            tokio::spawn(async move {
                let mut log = ProducerLog::default();
                let mut conn = HttpConn::new(port);
                let mut rng = Rng::new(tag ^ ((c as u64) << 32));
                let mut body = String::with_capacity(batch * 420 + 16);
                let mut seq = 0u64;
                // Spread the producers' schedules over one interval.
                let mut next =
                    interval.map(|i| Instant::now() + i.mul_f64(rng.below(1_000_000) as f64 / 1e6));
                while !stop.load(Ordering::Relaxed) {
                    if let (Some(at), Some(every)) = (next.as_mut(), interval) {
                        tokio::time::sleep_until((*at).into()).await;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        *at = (*at + every).max(Instant::now());
                    }
                    if let Some(left) = &requests {
                        let took = left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            n.checked_sub(1)
                        });
                        if took.is_err() {
                            break;
                        }
                    }
                    let drawn = rng.below(names.len() as u64) as usize;
                    let partition = &names[drawn];
                    data::push_body(&mut body, partition, batch, (tag, c), &mut seq, &mut rng);
                    let sent = Instant::now();
                    let answer = conn.request("POST", "/api/v1/push", body.as_bytes()).await;
                    let done = Instant::now();
                    let mut got = match &answer {
                        Ok(r) if r.status == 201 || r.status == 500 => verdicts(&r.body),
                        _ => Vec::new(),
                    };
                    let failed = got.len() != batch;
                    if failed {
                        let what = match answer {
                            Ok(r) => format!(
                                "HTTP {}: {}",
                                r.status,
                                String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                            ),
                            Err(e) => format!("push: {e}"),
                        };
                        log.errors += 1;
                        log.first_error.get_or_insert(what);
                        got = vec![Verdict::Unknown; batch];
                    }
                    let count = |v: Verdict| got.iter().filter(|&&g| g == v).count() as u32;
                    let (queued, buffered) = (count(Verdict::Queued), count(Verdict::Buffered));
                    log.requests.push(Request {
                        sent,
                        done,
                        queued,
                        buffered,
                        other: batch as u32 - queued - buffered,
                        partition: drawn as u32,
                    });
                    log.verdicts.extend(got);
                    if failed {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                log
            })
        })
        .collect()
}

/// Pushes at least `total` items, `batch` per request, from `connections` producers; returns
/// their logs. For filling the queue before a consuming measurement.
pub async fn fill(
    port: u16,
    connections: usize,
    batch: usize,
    partitions: u64,
    tag: u64,
    total: u64,
) -> Vec<ProducerLog> {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(total.div_ceil(batch as u64)));
    let workers = producers_limited(
        &[port],
        connections,
        batch,
        partitions,
        tag,
        stop,
        Some(requests),
        None,
    );
    let mut logs = Vec::new();
    for w in workers {
        logs.push(w.await.unwrap_or_default());
    }
    logs
}

/// A popped message: the fields an ack needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PoppedMessage<'a> {
    transaction_id: &'a str,
    partition_id: &'a str,
    lease_id: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PopBody<'a> {
    #[serde(borrow)]
    messages: Vec<PoppedMessage<'a>>,
    #[serde(default)]
    partitions_claimed: u32,
    #[serde(default)]
    autopilot: Option<Echo>,
}

/// The `autopilot` echo of a pop answer: the knobs the broker ran the pop with and its wait
/// advice (reference §2.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Echo {
    /// Partitions claimed at most.
    #[serde(default)]
    pub partitions: u32,
    /// Messages at most.
    #[serde(default)]
    pub batch: u32,
    /// Advised pause after an empty non-waiting pop, ms (0: none).
    #[serde(default)]
    pub wait_ms: u32,
}

/// What a pop answer said besides its messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopInfo {
    /// `partitionsClaimed`.
    pub claimed: u32,
    /// The `autopilot` echo, when the answer had one.
    pub echo: Option<Echo>,
}

/// Writes into `ack` the `/api/v1/ack/batch` body that completes every message of the pop
/// answer `pop` (with its lease); returns the messages' transaction ids.
///
/// # Errors
///
/// When `pop` is not a pop answer.
pub fn ack_for<'a>(pop: &'a [u8], ack: &mut String) -> Result<Vec<&'a str>, serde_json::Error> {
    read_pop(pop, ack).map(|(txns, _)| txns)
}

/// [`ack_for`], and what else the answer said.
///
/// # Errors
///
/// When `pop` is not a pop answer.
pub fn read_pop<'a>(
    pop: &'a [u8],
    ack: &mut String,
) -> Result<(Vec<&'a str>, PopInfo), serde_json::Error> {
    let body: PopBody = serde_json::from_slice(pop)?;
    ack.clear();
    ack.push_str("{\"acknowledgments\":[");
    for (k, m) in body.messages.iter().enumerate() {
        if k > 0 {
            ack.push(',');
        }
        ack.push_str("{\"transactionId\":\"");
        ack.push_str(m.transaction_id);
        ack.push_str("\",\"partitionId\":\"");
        ack.push_str(m.partition_id);
        ack.push_str("\",\"leaseId\":\"");
        ack.push_str(m.lease_id);
        ack.push_str("\",\"status\":\"completed\"}");
    }
    ack.push_str("],\"consumerGroup\":null}");
    let info = PopInfo {
        claimed: body.partitions_claimed,
        echo: body.autopilot,
    };
    Ok((
        body.messages.iter().map(|m| m.transaction_id).collect(),
        info,
    ))
}

/// Items of an `/ack/batch` answer that report `success: true`.
pub fn acked_ok(answer: &[u8]) -> usize {
    const OK: &[u8] = b"\"success\":true";
    answer.windows(OK.len()).filter(|w| *w == OK).count()
}

/// One pop + ack round trip of a consumer.
#[derive(Clone, Copy, Debug)]
pub struct Cycle {
    /// Pop sent.
    pub started: Instant,
    /// Pop answered.
    pub popped: Instant,
    /// Ack answered.
    pub acked: Instant,
    /// Messages popped and acked.
    pub msgs: u32,
}

/// One pop answer that carried an `autopilot` echo.
#[derive(Clone, Copy, Debug)]
pub struct EchoSeen {
    /// When the pop was answered.
    pub at: Instant,
    /// Messages it delivered.
    pub msgs: u32,
    /// Partitions it claimed (`partitionsClaimed`).
    pub claimed: u32,
    /// The echo.
    pub echo: Echo,
}

/// Everything one consumer did.
#[derive(Default)]
pub struct ConsumerLog {
    /// Every message popped from a producer of this measurement: (connection, sequence, when
    /// its pop answered).
    pub consumed: Vec<(u16, u64, Instant)>,
    /// Messages popped that came from elsewhere (the priming messages).
    pub other: u64,
    /// Every pop that returned messages, with its ack.
    pub cycles: Vec<Cycle>,
    /// Pops answered with no message (204, or 200 with an empty list) and when.
    pub empty: Vec<Instant>,
    /// Every answer with an `autopilot` echo.
    pub echoes: Vec<EchoSeen>,
    /// Pauses after empty answers as advised (`waitMs`, or 100 ms): when each began, and how
    /// long it was.
    pub paused: Vec<(Instant, Duration)>,
    /// Acks answered `success: false`.
    pub ack_failures: u64,
    /// Failed requests.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
}

/// Starts `n` consumers of the bench queue: pop up to `batch` messages (`wait`: long-poll up to
/// 1 s), ack them all in one `/ack/batch` (status completed, with their lease), repeat until
/// `stop` is set. `consumed` counts acked messages across consumers.
pub fn consumers(
    port: u16,
    n: usize,
    batch: usize,
    wait: bool,
    tag: u64,
    stop: Arc<AtomicBool>,
    consumed: Arc<AtomicU64>,
) -> Vec<JoinHandle<ConsumerLog>> {
    consumers_spread(&[port], n, batch, wait, tag, stop, consumed)
}

/// [`consumers`] spread over several brokers: consumer `k` talks to `ports[k % ports.len()]`.
pub fn consumers_spread(
    ports: &[u16],
    n: usize,
    batch: usize,
    wait: bool,
    tag: u64,
    stop: Arc<AtomicBool>,
    consumed: Arc<AtomicU64>,
) -> Vec<JoinHandle<ConsumerLog>> {
    consumers_with(
        ports,
        n,
        PopStyle::Fixed { batch, wait },
        tag,
        stop,
        consumed,
    )
}

/// The pop request of `style` on the bench queue.
pub fn pop_path(style: PopStyle) -> String {
    let q = data::QUEUE;
    let wait = |w: bool| {
        if w {
            "wait=true&timeout=1000"
        } else {
            "wait=false"
        }
    };
    match style {
        PopStyle::Fixed { batch, wait: w } => {
            format!("/api/v1/pop/queue/{q}?batch={batch}&{}", wait(w))
        }
        PopStyle::Autopilot { wait: w, .. } => {
            format!("/api/v1/pop/queue/{q}?autopilot=true&{}", wait(w))
        }
    }
}

/// How long a consumer of `style` pauses after an empty answer that carried `echo`.
pub fn pause_after_empty(style: PopStyle, echo: Option<Echo>) -> Duration {
    match style {
        PopStyle::Fixed { wait: false, .. } => Duration::from_millis(2),
        PopStyle::Autopilot {
            wait: false,
            honour_wait: true,
        } => Duration::from_millis(match echo.map_or(0, |e| e.wait_ms) {
            0 => 100,
            ms => u64::from(ms),
        }),
        // A long poll, or autopilot told to ignore the advice: pop again at once.
        _ => Duration::ZERO,
    }
}

/// [`consumers_spread`] popping as `style` says (fixed batch or autopilot, see [`PopStyle`]);
/// the echoes of autopilot pops and the pauses they advised are logged.
pub fn consumers_with(
    ports: &[u16],
    n: usize,
    style: PopStyle,
    tag: u64,
    stop: Arc<AtomicBool>,
    consumed: Arc<AtomicU64>,
) -> Vec<JoinHandle<ConsumerLog>> {
    let path = pop_path(style);
    let capacity = match style {
        PopStyle::Fixed { batch, .. } => batch,
        PopStyle::Autopilot { .. } => 1024,
    };
    (0..n)
        .map(|k| {
            let (path, stop, consumed) = (path.clone(), stop.clone(), consumed.clone());
            let port = ports[k % ports.len()];
            tokio::spawn(async move {
                let mut log = ConsumerLog::default();
                let mut conn = HttpConn::new(port);
                let mut ack = String::with_capacity(capacity * 160 + 64);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = match conn.request("GET", &path, b"").await {
                        Ok(r) => r,
                        Err(e) => {
                            log.errors += 1;
                            log.first_error.get_or_insert(format!("pop: {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let popped = Instant::now();
                    let read = match r.status {
                        204 => Ok((Vec::new(), PopInfo::default())),
                        200 => read_pop(&r.body, &mut ack),
                        _ => Ok((Vec::new(), PopInfo::default())),
                    };
                    let (txns, info) = match (r.status, read) {
                        (200 | 204, Ok(x)) => x,
                        (status, parsed) => {
                            log.errors += 1;
                            log.first_error.get_or_insert(format!(
                                "pop answered {status}: {} {}",
                                parsed.err().map_or(String::new(), |e| e.to_string()),
                                String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                            ));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    if let Some(echo) = info.echo {
                        log.echoes.push(EchoSeen {
                            at: popped,
                            msgs: txns.len() as u32,
                            claimed: info.claimed,
                            echo,
                        });
                    }
                    if txns.is_empty() {
                        // Nothing free right now: all partitions leased or drained.
                        log.empty.push(popped);
                        let pause = pause_after_empty(style, info.echo);
                        if !pause.is_zero() {
                            if style.autopilot() {
                                log.paused.push((popped, pause));
                            }
                            tokio::time::sleep(pause).await;
                        }
                        continue;
                    }
                    for txn in &txns {
                        match parse_txn(txn, tag) {
                            Some((c, seq)) => log.consumed.push((c as u16, seq, popped)),
                            None => log.other += 1,
                        }
                    }
                    let n = txns.len();
                    let answer = conn
                        .request("POST", "/api/v1/ack/batch", ack.as_bytes())
                        .await;
                    let acked = Instant::now();
                    match answer {
                        Ok(a) if a.status == 200 => {
                            log.ack_failures += n.saturating_sub(acked_ok(&a.body)) as u64;
                        }
                        Ok(a) => {
                            log.errors += 1;
                            log.ack_failures += n as u64;
                            log.first_error.get_or_insert(format!(
                                "ack answered {}: {}",
                                a.status,
                                String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
                            ));
                        }
                        Err(e) => {
                            log.errors += 1;
                            log.ack_failures += n as u64;
                            log.first_error.get_or_insert(format!("ack: {e}"));
                        }
                    }
                    consumed.fetch_add(n as u64, Ordering::Relaxed);
                    log.cycles.push(Cycle {
                        started,
                        popped,
                        acked,
                        msgs: n as u32,
                    });
                }
                log
            })
        })
        .collect()
}

/// How often each item of the producers appears somewhere (stored, or consumed).
pub struct Counts {
    per_conn: Vec<Vec<u8>>,
    /// Ids with a known tag but outside what the producers sent.
    pub stray: u64,
}

impl Counts {
    /// Zero counts shaped like the producers' logs.
    pub fn new(logs: &[ProducerLog]) -> Self {
        Self {
            per_conn: logs.iter().map(|l| vec![0; l.verdicts.len()]).collect(),
            stray: 0,
        }
    }

    /// Counts one appearance of (connection, sequence).
    pub fn add(&mut self, conn: usize, seq: u64) {
        match self
            .per_conn
            .get_mut(conn)
            .and_then(|v| v.get_mut(seq as usize))
        {
            Some(n) => *n = n.saturating_add(1),
            None => self.stray += 1,
        }
    }
}

/// Every item checked against what the broker answered for it.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Check {
    /// Items answered `queued` or `buffered` (must appear exactly once).
    pub acknowledged: u64,
    /// ... of which appear exactly once.
    pub exactly_once: u64,
    /// ... of which never appear.
    pub lost: u64,
    /// Extra appearances (an item seen twice counts 1).
    pub duplicates: u64,
    /// Items that appear although the broker did not acknowledge them (`failed`, `duplicate`),
    /// plus ids outside what was sent.
    pub unexpected: u64,
    /// Items whose request failed (outcome unknown: 0 or 1 appearance both fine).
    pub unknown: u64,
}

impl Check {
    /// Whether every acknowledged item appears exactly once and nothing else does.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.duplicates == 0 && self.unexpected == 0
    }
}

/// Checks `counts` against the producers' verdicts. With `only_queued`, `buffered` items are
/// not expected (a consumer cannot see them before replay).
pub fn check(logs: &[ProducerLog], counts: &Counts, only_queued: bool) -> Check {
    let mut c = Check {
        unexpected: counts.stray,
        ..Check::default()
    };
    for (log, seen) in logs.iter().zip(&counts.per_conn) {
        for (&v, &n) in log.verdicts.iter().zip(seen) {
            let n = u64::from(n);
            let expected = if only_queued {
                v == Verdict::Queued
            } else {
                v.acknowledged()
            };
            if v == Verdict::Unknown {
                c.unknown += 1;
                c.duplicates += n.saturating_sub(1);
            } else if expected {
                c.acknowledged += 1;
                match n {
                    0 => c.lost += 1,
                    1 => c.exactly_once += 1,
                    _ => {
                        c.exactly_once += 1;
                        c.duplicates += n - 1;
                    }
                }
            } else {
                c.unexpected += n;
            }
        }
    }
    c
}

/// The `pct` percentile of unsorted durations, in ms (NaN when empty).
pub fn percentile_ms(values: &mut [Duration], pct: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_unstable();
    let n = values.len();
    let at = ((n as f64 * pct / 100.0).ceil() as usize).clamp(1, n) - 1;
    values[at].as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_in_order() {
        let body = br#"[{"index":0,"status":"queued"},{"index":1,"status":"buffered"},{"status":"failed"},{"status":"weird"}]"#;
        assert_eq!(
            verdicts(body),
            vec![
                Verdict::Queued,
                Verdict::Buffered,
                Verdict::Failed,
                Verdict::Unknown
            ]
        );
        assert!(verdicts(b"[]").is_empty());
    }

    #[test]
    fn checks_find_lost_duplicate_and_unexpected_items() {
        let log = ProducerLog {
            verdicts: vec![
                Verdict::Queued,
                Verdict::Buffered,
                Verdict::Queued,
                Verdict::Failed,
                Verdict::Unknown,
            ],
            ..ProducerLog::default()
        };
        let logs = [log];
        let mut counts = Counts::new(&logs);
        counts.add(0, 0);
        counts.add(0, 1);
        counts.add(0, 1);
        counts.add(0, 3);
        counts.add(0, 9);
        let c = check(&logs, &counts, false);
        assert_eq!(
            (
                c.acknowledged,
                c.exactly_once,
                c.lost,
                c.duplicates,
                c.unexpected,
                c.unknown
            ),
            (3, 2, 1, 1, 2, 1)
        );
        assert!(!c.ok());
        let q = check(&logs, &counts, true);
        assert_eq!((q.acknowledged, q.lost, q.unexpected), (2, 1, 4));
    }

    #[test]
    fn a_pop_answer_becomes_the_ack_of_all_its_messages() {
        let pop = br#"{"messages":[{"transactionId":"t1","partitionId":"p1","leaseId":"l1","data":{"x":1}},{"transactionId":"t2","partitionId":"p1","leaseId":"l1","data":"y"}]}"#;
        let mut ack = String::from("stale");
        let txns = ack_for(pop, &mut ack).expect("a pop answer");
        assert_eq!(txns, vec!["t1", "t2"]);
        let v: serde_json::Value = serde_json::from_str(&ack).expect("valid JSON");
        assert_eq!(v["acknowledgments"][1]["transactionId"], "t2");
        assert_eq!(v["acknowledgments"][0]["leaseId"], "l1");
        assert_eq!(v["acknowledgments"][0]["status"], "completed");
        assert!(ack_for(b"[]", &mut ack).is_err());
        assert_eq!(
            acked_ok(br#"[{"success":true},{"success":false},{"success":true}]"#),
            2
        );
    }

    #[test]
    fn an_autopilot_answer_says_what_the_broker_chose_and_how_long_to_wait() {
        let pop = br#"{"success":true,"messages":[],"partitionsClaimed":0,"autopilot":{"partitions":4,"batch":128,"waitMs":200}}"#;
        let mut ack = String::new();
        let (txns, info) = read_pop(pop, &mut ack).expect("a pop answer");
        assert!(txns.is_empty());
        let echo = Echo {
            partitions: 4,
            batch: 128,
            wait_ms: 200,
        };
        assert_eq!(
            info,
            PopInfo {
                claimed: 0,
                echo: Some(echo)
            }
        );
        let honours = PopStyle::Autopilot {
            wait: false,
            honour_wait: true,
        };
        assert_eq!(
            pause_after_empty(honours, Some(echo)),
            Duration::from_millis(200)
        );
        let no_advice = Echo { wait_ms: 0, ..echo };
        assert_eq!(
            pause_after_empty(honours, Some(no_advice)),
            Duration::from_millis(100)
        );
        assert_eq!(pause_after_empty(honours, None), Duration::from_millis(100));
        let ignores = PopStyle::Autopilot {
            wait: false,
            honour_wait: false,
        };
        assert_eq!(pause_after_empty(ignores, Some(echo)), Duration::ZERO);
        let long_poll = PopStyle::Autopilot {
            wait: true,
            honour_wait: true,
        };
        assert_eq!(pause_after_empty(long_poll, Some(echo)), Duration::ZERO);
        assert_eq!(
            pop_path(honours),
            "/api/v1/pop/queue/bench?autopilot=true&wait=false"
        );
        assert_eq!(
            pop_path(PopStyle::Fixed {
                batch: 10,
                wait: true
            }),
            "/api/v1/pop/queue/bench?batch=10&wait=true&timeout=1000"
        );
        // A fixed pop's answer has no echo.
        let fixed = br#"{"messages":[{"transactionId":"t","partitionId":"p","leaseId":"l"}],"partitionsClaimed":1}"#;
        let (_, info) = read_pop(fixed, &mut ack).expect("a pop answer");
        assert_eq!(info.echo, None);
        assert_eq!(info.claimed, 1);
    }

    #[test]
    fn transaction_ids_round_trip() {
        let txn = data::transaction_id(0xabc, 7, 123_456);
        assert_eq!(parse_txn(&txn, 0xabc), Some((7, 123_456)));
        assert_eq!(parse_txn(&txn, 0xabd), None);
        assert_eq!(parse_txn("nope", 0xabc), None);
    }
}
