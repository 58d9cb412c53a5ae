//! Producing: the commit transaction that writes many partitions' segments at once, the dedup
//! sidecar, and queues and partitions created on first use.

pub mod commit;
pub mod dedup;
pub mod partitions;
