//! queen-broker: a PostgreSQL-backed message broker speaking Queen MQ's HTTP protocol.
//!
//! Map of the modules, top layer first (imports only point down; `scripts/check-layers` holds
//! it, docs/architecture.md draws it):
//! - [`app`]: wiring: database → migrations → actors → HTTP server; shutdown order.
//! - [`http`]: the route table, one handler per file, the auth gate, body limits, error mapping.
//! - [`kafka`]: the Kafka wire protocol on the same queues and partitions (beside `http`).
//! - [`auth`]: JWT verification, role sets and the capability each route requires.
//! - [`state`]: what every handler reaches (`AppState`), admission, the maintenance flags.
//! - [`ephemeral`]: ephemeral queues, rings in this broker's memory (beside `state`).
//! - [`history`]: the last hour of rates, backlogs, spool and commit latency, sampled for the
//!   dashboard's charts and the bounded backlog and 2.x state families of `/metrics`.
//! - [`protocol`]: request/response shapes and their rules (push and ack bodies, `Name`,
//!   timestamp formats).
//! - the actors (partition, committer, registry, spool) live in the `broker-actors` crate
//!   (`actors/`) and reach PostgreSQL only through its `SegmentStore` trait.
//! - [`metrics`]: the Prometheus registry (counters, histograms, gauges read at scrape time);
//!   the committers report to it through the actors crate's `CommitObserver`.
//! - [`storage`]: every SQL statement and [`storage::StorageError`]; the commit transaction is
//!   `storage::push::commit`.
//! - [`settings`]: environment variables (Queen's names) and `config/*.toml`.
//! - [`pg`]: a private PostgreSQL cluster from the local server binaries.
//! - [`logging`]: env_logger as text or one JSON object per line, with the request id.
//! - [`memory`]: the memory this broker may use (cgroup limit or physical memory), read once.
//! - [`tls`]: the HTTP listener's certificate and key (rustls), reloaded on SIGHUP.
//! - [`wake`]: long-poll wake-ups (in-process, and across brokers via LISTEN/NOTIFY).
// The OpenAPI document (http::openapi) is one json! literal deeper than the default limit.
#![recursion_limit = "256"]

pub mod app;
pub mod auth;
pub mod ephemeral;
pub mod history;
pub mod http;
pub mod kafka;
pub mod lag;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod pg;
pub mod protocol;
pub mod settings;
pub mod state;
pub mod storage;
pub mod tls;
pub mod wake;
