//! queen-broker: a PostgreSQL-backed message broker speaking Queen MQ's HTTP protocol.
//!
//! Map of the modules:
//! - [`settings`]: environment variables (Queen's names) and `config/*.toml`.
//! - [`app`]: wiring: database → migrations → actors → HTTP server; shutdown order.
//! - [`auth`]: JWT verification, role sets and the gate that checks every route's capability.
//! - [`http`]: the routes (`push`, `health`, ...), body limits and error mapping.
//! - [`storage`]: every SQL statement; the commit transaction is `storage::commit`.
//! - [`pg`]: a private PostgreSQL cluster from the local server binaries.
//! - [`wake`]: long-poll wake-ups (in-process, and across brokers via LISTEN/NOTIFY).
//!
//! The actors (partition, committer, registry) live in the `broker-actors` crate (`actors/`).

pub mod app;
pub mod auth;
pub mod http;
pub mod pg;
pub mod protocol;
pub mod settings;
pub mod state;
pub mod storage;
pub mod wake;
