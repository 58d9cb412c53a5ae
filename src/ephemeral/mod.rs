//! Ephemeral queues: FIFO rings per (queue, partition) held in this broker's memory only
//! (reference §2.7, docs/reads-and-ephemeral.md).
//!
//! Contents survive nothing: a restart starts every ring empty, and a message id carries the
//! broker incarnation that issued it, so an ack of an older incarnation's id answers `stale`.
//! Only the declared options are durable (`storage::queues::ephemeral`); the HTTP handlers write them
//! there and hand them to [`Store::configure`].
//!
//! Consumption comes from the pop's group, exactly as on durable queues: every group keeps
//! its own cursor over the one ring of each partition (same group = competing consumers, own
//! group = fan-out, no group = the queue-mode group). A message leaves the ring once every
//! group that reads the partition settled it, when its TTL passes, or when `drop_oldest`
//! makes room; a group not seen for [`GROUP_IDLE`] stops holding messages back.
//!
//! Memory is bounded twice: per queue (`maxBytes`, `maxLength`, with the queue's policy) and
//! over all queues by `QUEEN_EPHEMERAL_MAX_BYTES` (a push past it is refused with 503).
//! Every message counts its payload plus [`MESSAGE_OVERHEAD`] bytes.
//!
//! This module never touches PostgreSQL or HTTP; it sits beside `state`, below the handlers.

pub mod options;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::metrics::EphemeralMetrics;
pub use options::{Options, Policy};

/// Bytes a message costs beyond its payload (its entry in the ring, its id, its cursor state).
pub const MESSAGE_OVERHEAD: usize = 128;

/// A group that neither popped nor acked a partition for this long stops holding that
/// partition's messages in the ring.
pub const GROUP_IDLE: Duration = Duration::from_secs(600);

/// The group of a pop that names none (one shared cursor).
pub const QUEUE_MODE: &str = "__QUEUE_MODE__";

/// The partition of a push that names none.
pub const DEFAULT_PARTITION: &str = "Default";

/// Most messages one pop returns.
pub const MAX_BATCH: usize = 10_000;

/// Why an ephemeral call was refused.
#[derive(Debug, thiserror::Error)]
pub enum EphemeralError {
    /// Malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// The queue does not exist (only `depth` says so).
    #[error("ephemeral queue {0:?} not found")]
    NotFound(String),
    /// The push would take the queue past `maxBytes`/`maxLength` under policy `reject`.
    #[error("ephemeral queue {queue:?} is full ({what}); retry later")]
    Full {
        /// Queue name.
        queue: String,
        /// Which bound.
        what: String,
    },
    /// The push would take every ephemeral queue past `QUEEN_EPHEMERAL_MAX_BYTES`.
    #[error(
        "ephemeral memory budget exhausted (QUEEN_EPHEMERAL_MAX_BYTES = {0} bytes); retry later"
    )]
    Budget(usize),
}

impl EphemeralError {
    /// The stable code the client branches on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "ephemeral_bad_request",
            Self::NotFound(_) => "ephemeral_queue_not_found",
            Self::Full { .. } => "ephemeral_queue_full",
            Self::Budget(_) => "ephemeral_memory_exhausted",
        }
    }
}

/// An ack's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// Done with the message.
    Completed,
    /// Give it back (with `attempts + 1`, until `retryLimit`).
    Retry,
}

/// What an ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Settled: it will not be delivered to the group again (also a failure past
    /// `retryLimit`: dropped and counted).
    Acked,
    /// Given back for another delivery.
    Redelivered,
    /// The delivery it names is over: another incarnation, a lease that ran out, a reset,
    /// an expired or dropped message, an ack already made.
    Stale,
    /// Not an id of this queue and group.
    Unknown,
}

impl AckOutcome {
    /// Wire name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Acked => "acked",
            Self::Redelivered => "redelivered",
            Self::Stale => "stale",
            Self::Unknown => "unknown",
        }
    }
}

/// One delivered message.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Opaque id (incarnation, partition, sequence, attempt).
    pub id: String,
    /// Partition name.
    pub partition: String,
    /// Payload JSON text as pushed.
    pub payload: Arc<str>,
    /// Delivery number, 1 for the first.
    pub attempts: u32,
}

struct Message {
    seq: u64,
    payload: Arc<str>,
    expires_at: Option<Instant>,
}

impl Message {
    fn cost(&self) -> usize {
        self.payload.len() + MESSAGE_OVERHEAD
    }
}

#[derive(Default)]
struct Cursor {
    /// Next sequence never delivered to this group.
    next: u64,
    /// Leased: sequence → (attempt, lease expiry).
    leased: BTreeMap<u64, (u32, Instant)>,
    /// Given back: sequence → the attempt number of its next delivery.
    retry: BTreeMap<u64, u32>,
    last_seen: Option<Instant>,
}

impl Cursor {
    /// The lowest sequence this group still needs.
    fn low(&self) -> u64 {
        let mut low = self.next;
        if let Some((&s, _)) = self.leased.iter().next() {
            low = low.min(s);
        }
        if let Some((&s, _)) = self.retry.iter().next() {
            low = low.min(s);
        }
        low
    }
}

struct Partition {
    ordinal: u64,
    ring: VecDeque<Message>,
    next_seq: u64,
    groups: HashMap<String, Cursor>,
}

impl Partition {
    fn head_seq(&self) -> u64 {
        self.ring.front().map_or(self.next_seq, |m| m.seq)
    }
}

#[derive(Default)]
struct Counters {
    dropped_ttl: u64,
    dropped_policy: u64,
    dropped_retries: u64,
    pushed: u64,
}

struct Queue {
    options: Options,
    declared: bool,
    partitions: BTreeMap<String, Partition>,
    length: usize,
    bytes: usize,
    counters: Counters,
    notify: Arc<Notify>,
    /// Where the next queue-wide pop starts looking (round robin over partitions).
    turn: usize,
}

impl Queue {
    fn new(options: Options, declared: bool) -> Self {
        Self {
            options,
            declared,
            partitions: BTreeMap::new(),
            length: 0,
            bytes: 0,
            counters: Counters::default(),
            notify: Arc::new(Notify::new()),
            turn: 0,
        }
    }
}

/// Every ephemeral queue of this broker.
pub struct Store {
    incarnation: u64,
    budget: usize,
    used: AtomicUsize,
    next_ordinal: AtomicU64,
    queues: Mutex<HashMap<String, Queue>>,
    metrics: Option<EphemeralMetrics>,
}

/// Parsed message id.
struct Id {
    incarnation: u64,
    ordinal: u64,
    seq: u64,
    attempt: u32,
}

fn parse_id(id: &str) -> Option<Id> {
    let rest = id.strip_prefix('e')?;
    let mut parts = rest.split('-');
    let incarnation = u64::from_str_radix(parts.next()?, 16).ok()?;
    let ordinal = u64::from_str_radix(parts.next()?, 16).ok()?;
    let seq = u64::from_str_radix(parts.next()?, 16).ok()?;
    let attempt = u32::from_str_radix(parts.next()?, 16).ok()?;
    parts.next().is_none().then_some(Id {
        incarnation,
        ordinal,
        seq,
        attempt,
    })
}

impl Store {
    /// An empty store with a fresh incarnation and a memory budget of `budget` bytes.
    pub fn new(budget: usize, metrics: Option<EphemeralMetrics>) -> Self {
        // A random incarnation: ids of an earlier process (or another broker) never match.
        let incarnation = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .expect("8 bytes"),
        );
        let store = Self {
            incarnation,
            budget,
            used: AtomicUsize::new(0),
            next_ordinal: AtomicU64::new(1),
            queues: Mutex::new(HashMap::new()),
            metrics,
        };
        if let Some(m) = &store.metrics {
            m.budget_bytes.set(budget as i64);
        }
        store
    }

    /// This store's incarnation (carried by every id it issues).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Bytes held now, over every queue.
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue>> {
        self.queues.lock().expect("ephemeral store lock poisoned")
    }

    fn report(&self, queues: &HashMap<String, Queue>) {
        if let Some(m) = &self.metrics {
            m.queues.set(queues.len() as i64);
            m.messages
                .set(queues.values().map(|q| q.length as i64).sum::<i64>());
            m.bytes.set(self.used_bytes() as i64);
        }
    }

    fn count_dropped(&self, reason: &str, n: u64) {
        if let (Some(m), true) = (&self.metrics, n > 0) {
            m.dropped.with_label_values(&[reason]).inc_by(n);
        }
    }

    /// Whether the queue is known to this broker (declared or used).
    pub fn knows(&self, queue: &str) -> bool {
        self.lock().contains_key(queue)
    }

    /// Declares `queue` with `options` (replacing earlier options; contents stay, and the
    /// new bounds apply to the next push).
    pub fn configure(&self, queue: &str, options: Options) {
        let mut queues = self.lock();
        let q = queues
            .entry(queue.to_string())
            .or_insert_with(|| Queue::new(options.clone(), true));
        q.options = options;
        q.declared = true;
        self.report(&queues);
    }

    /// Makes `queue` known with `options` unless it already is (a push or pop naming an
    /// unknown queue; `options` come from its stored declaration or are the defaults).
    pub fn ensure(&self, queue: &str, options: Option<Options>) {
        let mut queues = self.lock();
        if !queues.contains_key(queue) {
            let declared = options.is_some();
            queues.insert(
                queue.to_string(),
                Queue::new(options.unwrap_or_default(), declared),
            );
            self.report(&queues);
        }
    }

    /// Drops every message, lease and cursor of `queue`; its options stay. Returns the
    /// number of messages dropped (0 for an unknown queue).
    pub fn reset(&self, queue: &str) -> usize {
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(queue) else {
            return 0;
        };
        let dropped = q.length;
        self.used.fetch_sub(q.bytes, Ordering::Relaxed);
        q.partitions.clear();
        q.length = 0;
        q.bytes = 0;
        self.report(&queues);
        dropped
    }

    /// Forgets `queue` entirely; whether it was known.
    pub fn delete(&self, queue: &str) -> bool {
        let mut queues = self.lock();
        let Some(q) = queues.remove(queue) else {
            return false;
        };
        self.used.fetch_sub(q.bytes, Ordering::Relaxed);
        // Waiting pops wake up, find the queue gone and answer empty at their deadline.
        q.notify.notify_waiters();
        self.report(&queues);
        true
    }

    /// Appends `payloads` to `partition` of `queue` (known: see [`Store::ensure`]), all or
    /// nothing. Returns how many were pushed.
    ///
    /// # Errors
    ///
    /// [`EphemeralError::Budget`] past the memory budget, [`EphemeralError::Full`] past the
    /// queue's bounds under `reject`, [`EphemeralError::BadRequest`] for a push larger than
    /// the queue's bounds on its own.
    pub fn push(
        &self,
        queue: &str,
        partition: &str,
        payloads: Vec<String>,
    ) -> Result<usize, EphemeralError> {
        let n = payloads.len();
        let cost: usize = payloads.iter().map(|p| p.len() + MESSAGE_OVERHEAD).sum();
        let mut queues = self.lock();
        let q = queues
            .entry(queue.to_string())
            .or_insert_with(|| Queue::new(Options::default(), false));
        let opts = q.options.clone();
        if n as u64 > opts.max_length || cost as u64 > opts.max_bytes {
            return Err(EphemeralError::BadRequest(format!(
                "a push of {n} messages ({cost} bytes with overhead) exceeds the queue's maxLength {} or maxBytes {}",
                opts.max_length, opts.max_bytes
            )));
        }
        let over = |q: &Queue| {
            (q.length + n) as u64 > opts.max_length || (q.bytes + cost) as u64 > opts.max_bytes
        };
        let mut dropped = 0u64;
        if over(q) {
            match opts.policy {
                Policy::Reject => {
                    return Err(EphemeralError::Full {
                        queue: queue.to_string(),
                        what: if (q.length + n) as u64 > opts.max_length {
                            format!("maxLength {}", opts.max_length)
                        } else {
                            format!("maxBytes {}", opts.max_bytes)
                        },
                    })
                }
                Policy::DropOldest => {
                    // The pushed partition first, then the partition with the oldest head.
                    while over(q) {
                        let victim = if q
                            .partitions
                            .get(partition)
                            .is_some_and(|p| !p.ring.is_empty())
                        {
                            partition.to_string()
                        } else {
                            match q
                                .partitions
                                .iter()
                                .filter(|(_, p)| !p.ring.is_empty())
                                .min_by_key(|(_, p)| p.ordinal)
                                .map(|(name, _)| name.clone())
                            {
                                Some(name) => name,
                                None => break,
                            }
                        };
                        let p = q.partitions.get_mut(&victim).expect("victim exists");
                        let m = p.ring.pop_front().expect("victim is not empty");
                        q.length -= 1;
                        q.bytes -= m.cost();
                        self.used.fetch_sub(m.cost(), Ordering::Relaxed);
                        dropped += 1;
                    }
                }
            }
        }
        // The global budget: what this push adds beyond what it made room for.
        let before = self.used.fetch_add(cost, Ordering::Relaxed);
        if before + cost > self.budget {
            self.used.fetch_sub(cost, Ordering::Relaxed);
            q.counters.dropped_policy += dropped;
            self.count_dropped("policy", dropped);
            self.report(&queues);
            return Err(EphemeralError::Budget(self.budget));
        }
        q.counters.dropped_policy += dropped;
        q.counters.pushed += n as u64;
        let expires_at =
            (opts.ttl_seconds > 0).then(|| Instant::now() + Duration::from_secs(opts.ttl_seconds));
        let ordinal = &self.next_ordinal;
        let p = q
            .partitions
            .entry(partition.to_string())
            .or_insert_with(|| Partition {
                ordinal: ordinal.fetch_add(1, Ordering::Relaxed),
                ring: VecDeque::new(),
                next_seq: 0,
                groups: HashMap::new(),
            });
        for payload in payloads {
            p.ring.push_back(Message {
                seq: p.next_seq,
                payload: payload.into(),
                expires_at,
            });
            p.next_seq += 1;
        }
        q.length += n;
        q.bytes += cost;
        q.notify.notify_waiters();
        self.count_dropped("policy", dropped);
        self.report(&queues);
        Ok(n)
    }

    /// The notifier a waiting pop of `queue` parks on (pushes and redeliveries wake it).
    pub fn waker(&self, queue: &str) -> Option<Arc<Notify>> {
        self.lock().get(queue).map(|q| q.notify.clone())
    }

    /// Takes up to `batch` messages of `queue` for `group` (from `partition`, or from any
    /// partition, round robin), leasing them unless `auto_ack`.
    pub fn pop(
        &self,
        queue: &str,
        partition: Option<&str>,
        group: &str,
        batch: usize,
        auto_ack: bool,
    ) -> Vec<Delivered> {
        let now = Instant::now();
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(queue) else {
            return Vec::new();
        };
        let lease = Duration::from_secs(q.options.lease_seconds);
        let retry_limit = q.options.retry_limit;
        // What outlived its TTL goes before anything is handed out.
        let (freed, n) = trim(q, now);
        self.used.fetch_sub(freed, Ordering::Relaxed);
        q.counters.dropped_ttl += n;
        self.count_dropped("ttl", n);
        let names: Vec<String> = match partition {
            Some(p) => vec![p.to_string()],
            None => {
                let all: Vec<String> = q.partitions.keys().cloned().collect();
                let start = if all.is_empty() {
                    0
                } else {
                    q.turn % all.len()
                };
                q.turn = q.turn.wrapping_add(1);
                all[start..]
                    .iter()
                    .chain(all[..start].iter())
                    .cloned()
                    .collect()
            }
        };
        let mut out = Vec::new();
        let mut dropped_retries = 0u64;
        for name in names {
            if out.len() >= batch {
                break;
            }
            let Some(p) = q.partitions.get_mut(&name) else {
                continue;
            };
            let head = p.head_seq();
            let cursor = p.groups.entry(group.to_string()).or_insert_with(|| Cursor {
                next: head,
                ..Cursor::default()
            });
            cursor.last_seen = Some(now);
            dropped_retries += expire_leases(cursor, now, retry_limit);
            if cursor.next < head {
                cursor.next = head;
            }
            // Given-back messages first (lowest sequence first), then new ones.
            let mut picks: Vec<(u64, u32)> = Vec::new();
            let retry: Vec<(u64, u32)> = cursor
                .retry
                .iter()
                .map(|(s, a)| (*s, *a))
                .take(batch - out.len())
                .collect();
            for (seq, attempt) in retry {
                cursor.retry.remove(&seq);
                if seq >= head {
                    picks.push((seq, attempt));
                }
            }
            while picks.len() + out.len() < batch && cursor.next < p.next_seq {
                picks.push((cursor.next, 1));
                cursor.next += 1;
            }
            for (seq, attempt) in picks {
                // Every pick is at or past the head (older retries were left out above).
                let Some(m) = p.ring.get((seq - head) as usize) else {
                    continue;
                };
                if !auto_ack {
                    cursor.leased.insert(seq, (attempt, now + lease));
                }
                out.push(Delivered {
                    id: format!(
                        "e{:016x}-{:x}-{:x}-{:x}",
                        self.incarnation, p.ordinal, seq, attempt
                    ),
                    partition: name.clone(),
                    payload: m.payload.clone(),
                    attempts: attempt,
                });
            }
        }
        q.counters.dropped_retries += dropped_retries;
        self.count_dropped("retries", dropped_retries);
        let (freed, n) = trim(q, now);
        self.used.fetch_sub(freed, Ordering::Relaxed);
        q.counters.dropped_ttl += n;
        self.count_dropped("ttl", n);
        self.report(&queues);
        out
    }

    /// Applies one ack of `group` on `queue`.
    pub fn ack(&self, queue: &str, group: &str, id: &str, status: AckStatus) -> AckOutcome {
        let Some(id) = parse_id(id) else {
            return AckOutcome::Unknown;
        };
        if id.incarnation != self.incarnation {
            return AckOutcome::Stale;
        }
        let now = Instant::now();
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(queue) else {
            return AckOutcome::Unknown;
        };
        let retry_limit = q.options.retry_limit;
        let Some(p) = q.partitions.values_mut().find(|p| p.ordinal == id.ordinal) else {
            // Ordinals are never reused: the partition was reset or deleted since.
            return if id.ordinal < self.next_ordinal.load(Ordering::Relaxed) {
                AckOutcome::Stale
            } else {
                AckOutcome::Unknown
            };
        };
        let head = p.head_seq();
        let next_seq = p.next_seq;
        let Some(cursor) = p.groups.get_mut(group) else {
            return AckOutcome::Unknown;
        };
        cursor.last_seen = Some(now);
        if id.seq >= cursor.next || id.seq >= next_seq {
            return AckOutcome::Unknown;
        }
        let outcome = match cursor.leased.get(&id.seq) {
            Some(&(attempt, _)) if attempt == id.attempt && id.seq >= head => {
                cursor.leased.remove(&id.seq);
                match status {
                    AckStatus::Completed => AckOutcome::Acked,
                    AckStatus::Retry if attempt > retry_limit => {
                        q.counters.dropped_retries += 1;
                        self.count_dropped("retries", 1);
                        AckOutcome::Acked
                    }
                    AckStatus::Retry => {
                        cursor.retry.insert(id.seq, attempt + 1);
                        q.notify.notify_waiters();
                        AckOutcome::Redelivered
                    }
                }
            }
            _ => AckOutcome::Stale,
        };
        let (freed, n) = trim(q, now);
        self.used.fetch_sub(freed, Ordering::Relaxed);
        q.counters.dropped_ttl += n;
        self.count_dropped("ttl", n);
        self.report(&queues);
        outcome
    }

    /// Lease expiry, TTL and idle groups for every queue; wakes the pops of queues where a
    /// message came back. Run every second by the broker.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut queues = self.lock();
        for q in queues.values_mut() {
            let retry_limit = q.options.retry_limit;
            let mut back = false;
            let mut dropped = 0;
            for p in q.partitions.values_mut() {
                p.groups.retain(|_, c| {
                    c.leased.len() + c.retry.len() > 0
                        || c.last_seen
                            .is_none_or(|t| now.duration_since(t) < GROUP_IDLE)
                });
                for c in p.groups.values_mut() {
                    let before = c.retry.len();
                    dropped += expire_leases(c, now, retry_limit);
                    back |= c.retry.len() > before;
                }
            }
            q.counters.dropped_retries += dropped;
            self.count_dropped("retries", dropped);
            let (freed, n) = trim(q, now);
            self.used.fetch_sub(freed, Ordering::Relaxed);
            q.counters.dropped_ttl += n;
            self.count_dropped("ttl", n);
            if back {
                q.notify.notify_waiters();
            }
        }
        self.report(&queues);
    }

    /// The gauges of one queue (`None`: unknown).
    pub fn depth(&self, queue: &str) -> Option<Value> {
        let queues = self.lock();
        let q = queues.get(queue)?;
        Some(queue_json(queue, q, true))
    }

    /// Every queue this broker knows, by name, with its gauges.
    pub fn list(&self) -> Vec<Value> {
        let queues = self.lock();
        let mut names: Vec<&String> = queues.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|n| queue_json(n, &queues[n], false))
            .collect()
    }
}

/// Moves the cursor's leases that ran out back for redelivery (or drops them past the retry
/// limit); returns how many were dropped.
fn expire_leases(cursor: &mut Cursor, now: Instant, retry_limit: u32) -> u64 {
    let expired: Vec<(u64, u32)> = cursor
        .leased
        .iter()
        .filter(|(_, (_, until))| *until <= now)
        .map(|(s, (a, _))| (*s, *a))
        .collect();
    let mut dropped = 0;
    for (seq, attempt) in expired {
        cursor.leased.remove(&seq);
        if attempt > retry_limit {
            dropped += 1;
        } else {
            cursor.retry.insert(seq, attempt + 1);
        }
    }
    dropped
}

/// Removes from the front of each ring what every group settled and what outlived its TTL;
/// returns (bytes freed, messages dropped by TTL).
fn trim(q: &mut Queue, now: Instant) -> (usize, u64) {
    let mut freed = 0;
    let mut expired = 0;
    for p in q.partitions.values_mut() {
        let low = p.groups.values().map(Cursor::low).min();
        while let Some(m) = p.ring.front() {
            let settled = low.is_some_and(|low| m.seq < low);
            let dead = m.expires_at.is_some_and(|t| t <= now);
            if !(settled || dead) {
                break;
            }
            if dead && !settled {
                expired += 1;
            }
            freed += m.cost();
            q.length -= 1;
            q.bytes -= m.cost();
            p.ring.pop_front();
        }
    }
    (freed, expired)
}

fn queue_json(name: &str, q: &Queue, detail: bool) -> Value {
    let mut out = json!({
        "queue": name,
        "declared": q.declared,
        "length": q.length,
        "bytes": q.bytes,
        "partitions": q.partitions.len(),
        "options": q.options.to_json(),
        "pushed": q.counters.pushed,
        "dropped": {
            "ttl": q.counters.dropped_ttl,
            "policy": q.counters.dropped_policy,
            "retries": q.counters.dropped_retries,
        },
    });
    if detail {
        // Per group: messages it has still to receive, leased to it, and given back.
        let mut groups: BTreeMap<&str, (u64, usize, usize)> = BTreeMap::new();
        for p in q.partitions.values() {
            for (g, c) in &p.groups {
                let e = groups.entry(g.as_str()).or_default();
                e.0 += p.next_seq.saturating_sub(c.next.max(p.head_seq()));
                e.1 += c.leased.len();
                e.2 += c.retry.len();
            }
        }
        out["groups"] = groups
            .into_iter()
            .map(|(g, (pending, leased, retry))| {
                json!({ "group": g, "pending": pending, "leased": leased, "redeliveries": retry })
            })
            .collect();
        out["partitionList"] = q
            .partitions
            .iter()
            .take(1000)
            .map(|(n, p)| json!({ "partition": n, "length": p.ring.len() }))
            .collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        Store::new(1 << 20, None)
    }

    #[test]
    fn ids_round_trip_and_foreign_ids_are_stale_or_unknown() {
        let s = store();
        s.push("q", "p", vec!["1".into()]).expect("pushed");
        let got = s.pop("q", None, QUEUE_MODE, 10, false);
        assert_eq!(got.len(), 1);
        let id = parse_id(&got[0].id).expect("parses");
        assert_eq!(
            (id.incarnation, id.seq, id.attempt),
            (s.incarnation(), 0, 1)
        );
        let other = format!("e{:016x}-1-0-1", s.incarnation() ^ 1);
        assert_eq!(
            s.ack("q", QUEUE_MODE, &other, AckStatus::Completed),
            AckOutcome::Stale
        );
        assert_eq!(
            s.ack("q", QUEUE_MODE, "nope", AckStatus::Completed),
            AckOutcome::Unknown
        );
        assert_eq!(
            s.ack("q", QUEUE_MODE, &got[0].id, AckStatus::Completed),
            AckOutcome::Acked
        );
        assert_eq!(
            s.ack("q", QUEUE_MODE, &got[0].id, AckStatus::Completed),
            AckOutcome::Stale
        );
        assert_eq!(s.used_bytes(), 0, "a settled message leaves the ring");
    }

    #[test]
    fn retries_come_back_until_the_limit_then_drop() {
        let s = store();
        s.configure(
            "q",
            Options {
                retry_limit: 1,
                ..Options::default()
            },
        );
        s.push("q", "p", vec!["1".into()]).expect("pushed");
        let first = s.pop("q", None, "g", 1, false);
        assert_eq!(
            s.ack("q", "g", &first[0].id, AckStatus::Retry),
            AckOutcome::Redelivered
        );
        let second = s.pop("q", None, "g", 1, false);
        assert_eq!(second[0].attempts, 2);
        assert_eq!(
            s.ack("q", "g", &second[0].id, AckStatus::Retry),
            AckOutcome::Acked
        );
        assert!(s.pop("q", None, "g", 1, false).is_empty());
        assert_eq!(s.depth("q").expect("known")["dropped"]["retries"], 1);
    }
}
