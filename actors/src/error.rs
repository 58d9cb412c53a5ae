//! Errors of the write path, as the HTTP layer sees them.

use std::time::Duration;

/// Why a push could not be answered with per-item verdicts.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// A bounded queue on the write path is full; the producer should retry after the delay.
    #[error("broker is overloaded, retry after {0:?}")]
    Overloaded(Duration),
    /// The actor that owned the write went away before answering.
    #[error("partition actor stopped before answering")]
    ActorStopped,
    /// The commit failed and the items could not be handed to the spool.
    #[error("commit failed: {0}")]
    CommitFailed(String),
}

/// Why a commit failed, as reported by a [`crate::store::SegmentStore`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// PostgreSQL could not be reached, or the connection broke.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The transaction failed for another reason (its outcome may be unknown).
    #[error("commit transaction failed: {0}")]
    Transaction(String),
    /// PostgreSQL refused a value of the batch (a data exception or an integrity violation):
    /// the items' fault, not the database's; retried alone, a refused item is quarantined.
    #[error("commit refused by PostgreSQL: {0}")]
    Refused(String),
}
