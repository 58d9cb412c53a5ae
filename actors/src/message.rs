//! The values that travel through the write path: items as accepted, partition keys and the
//! per-item verdicts that go back to the producer.

use std::fmt;
use std::sync::Arc;

use uuid::Uuid;

/// A (queue, partition) pair: the unit of ordering and of the partition actor.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    /// Queue name.
    pub queue: Arc<str>,
    /// Partition name.
    pub partition: Arc<str>,
}

impl PartitionKey {
    /// Builds a key from borrowed names.
    pub fn new(queue: &str, partition: &str) -> Self {
        Self {
            queue: Arc::from(queue),
            partition: Arc::from(partition),
        }
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.queue, self.partition)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.queue, self.partition)
    }
}

/// One message as the broker accepted it, with the facts the broker adds on arrival.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Id minted on arrival (UUIDv7); the id the stored message carries.
    pub message_id: Uuid,
    /// The dedup key: the producer's `transactionId`, or the message id as text.
    pub transaction_id: String,
    /// The payload exactly as received (raw JSON text).
    pub payload: Box<str>,
    /// The `sub` claim of the producer's token, if any.
    pub producer_sub: Option<String>,
    /// Trace id (transaction pushes only).
    pub trace_id: Option<String>,
    /// Arrival time, microseconds since the Unix epoch.
    pub arrived_at_micros: i64,
}

/// What became of one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Committed with an offset; visible to consumers.
    Queued,
    /// Same transactionId already stored in the partition inside the window; nothing written.
    /// Carries the original's id, or the all-zero UUID when its segment is gone.
    Duplicate(Uuid),
    /// Appended to the disk spool; replayed once PostgreSQL answers.
    Buffered,
    /// Neither stored nor spooled; the producer must retry.
    Failed,
    /// Refused by the store for a reason of the queue's own (nothing written); on the wire
    /// this is `failed`, with the reason as the item's `error`.
    Refused(Refusal),
}

/// Why the store refused an item of a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue already holds `limit` (its `maxSize`) messages that are not yet consumed.
    QueueFull {
        /// The queue's `maxSize`.
        limit: i64,
    },
    /// The queue is encrypted and this broker has no `QUEEN_ENCRYPTION_KEY`.
    NoKey,
}

impl Refusal {
    /// The item's `error` text for a push to `queue`.
    pub fn message(&self, queue: &str) -> String {
        match self {
            Refusal::QueueFull { limit } => format!(
                "queue {queue} is full: maxSize {limit} messages not yet consumed; nothing stored"
            ),
            Refusal::NoKey => format!(
                "queue {queue} has encryptionEnabled and this broker has no QUEEN_ENCRYPTION_KEY; nothing stored"
            ),
        }
    }
}

impl Verdict {
    /// The wire name of the verdict.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Queued => "queued",
            Verdict::Duplicate(_) => "duplicate",
            Verdict::Buffered => "buffered",
            Verdict::Failed | Verdict::Refused(_) => "failed",
        }
    }
}
