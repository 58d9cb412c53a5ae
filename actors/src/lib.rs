//! The broker's actors: the write path between the HTTP layer and PostgreSQL.
//!
//! - [`partition::PartitionActor`]: one per (queue, partition); one write in flight, pushes
//!   arriving meanwhile leave together as the next segment.
//! - [`registry::Registry`]: creates partition actors on demand and forgets idle ones.
//! - [`committer::Committer`]: merges ready segments of many partitions into one transaction
//!   through a [`store::SegmentStore`].
//! - [`spool`]: the disk spool that takes items whose commit failed, and replays them.
//! - [`observe`]: the small trait through which committers report each commit (metrics).
//! - [`codec`]: the bytes of one item, shared by the spool's records and the broker's stored
//!   segment frames.
//!
//! This crate never speaks HTTP or SQL: PostgreSQL is reached only through `SegmentStore`,
//! which the broker implements in `src/storage` and tests may fake.

pub mod codec;
pub mod committer;
pub mod error;
pub mod message;
pub mod observe;
pub mod partition;
pub mod registry;
pub mod spool;
pub mod store;

pub use error::PushError;
pub use message::{Item, PartitionKey, Refusal, Verdict};
