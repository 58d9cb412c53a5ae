//! The boundary between the actors and PostgreSQL: a committer hands a batch of segments to a
//! `SegmentStore` and gets one outcome per segment back.

use std::future::Future;

use crate::error::StoreError;
use crate::message::{Item, PartitionKey, Verdict};

/// One partition's ready segment: its items in acceptance order.
#[derive(Debug)]
pub struct SegmentWrite {
    /// The partition written.
    pub key: PartitionKey,
    /// The partition's database id, when already known to the actor.
    pub partition_id: Option<i64>,
    /// The items, in the order their offsets must follow.
    pub items: Vec<Item>,
}

/// The result of one committed segment.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentOutcome {
    /// The partition's database id (cached by the actor for its next write).
    pub partition_id: i64,
    /// One verdict per item of the segment, in item order.
    pub verdicts: Vec<Verdict>,
}

/// Writes batches of segments in one transaction.
///
/// A store is owned by exactly one committer, so it may keep its own connection.
pub trait SegmentStore: Unpin + 'static {
    /// Commits every segment of `batch` in one transaction: all of them or none.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the transaction did not commit (or its outcome is unknown); the
    /// caller then treats every item of the batch as not stored.
    fn commit(
        &mut self,
        batch: &[SegmentWrite],
    ) -> impl Future<Output = Result<Vec<SegmentOutcome>, StoreError>>;
}
