//! What the dashboard's status and analytics routes read, message traces, and the views of
//! the 2.x state (KV namespaces, locks, timers, stream queries), and the Kafka topics and groups.

pub mod features;
pub mod kafka;
pub mod status;
pub mod traces;
