//! Queues and what operators read and change about them: the catalog (options, listing and
//! deletion),
//! consumer groups, resource counts, retention, messages read back, reads without a lease, ephemeral queue declarations, partitions stopped in front of
//! undecryptable messages, and what consumer state says about stored messages.

pub mod catalog;
pub mod ephemeral;
pub mod groups;
pub mod lag;
pub mod messages;
pub mod progress;
pub mod reads;
pub mod resources;
pub mod retention;
pub mod undecryptable;
