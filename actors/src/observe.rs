//! How the actors report what they do, without knowing who listens: the broker implements
//! [`CommitObserver`] on top of its metrics registry; tests may count; nothing is reported
//! when no observer is set. The crate stays free of HTTP and of any metrics library.

use std::time::Duration;

/// One finished commit of a committer (a transaction of one or more segments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitReport {
    /// Segments (one per partition) in the transaction.
    pub segments: usize,
    /// Items in the transaction.
    pub items: usize,
    /// From handing the batch to the store until it answered.
    pub elapsed: Duration,
    /// Whether the transaction committed.
    pub committed: bool,
}

/// Receives one [`CommitReport`] per commit; called on the committer's thread, so it must be
/// cheap (counters and histogram observations, no I/O).
pub trait CommitObserver: Send + Sync + 'static {
    /// A commit finished.
    fn committed(&self, report: &CommitReport);
}
