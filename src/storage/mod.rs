//! All of the broker's SQL, grouped by concept, one folder or file per group of tables:
//!
//! - [`push`]: producing — the commit transaction that writes many partitions' segments at once,
//!   the dedup sidecar, queues and partitions created on first use.
//! - [`segments`]: segments as stored and read — the frame encoding, the segment cache, payload
//!   encryption at rest.
//! - [`consume`]: the pop (find, claim under a lease, read by offset range), then by step:
//!   claims ahead and hand-offs, grouped claims and acks, leases, acks as offset commits and
//!   dead letters; the
//!   2.x extensions (autopilot, conflation, `leaseSeconds`).
//! - [`queues`]: queues and what operators read and change about them (options,
//!   consumer groups, resources, retention, messages, reads without a lease,
//!   ephemeral declarations, undecryptable stops, consumer progress).
//! - [`kv`]: the key/value store, locks and semaphores as KV rows, the expiry sweeper.
//! - [`timers`]: timers (schedule, cancel, peek, list) and the task that fires them.
//! - [`streams`]: the streams runtime: registered queries, state rows, the atomic cycle.
//! - [`cluster`]: what every broker on the database shares — multi-host URLs and the primary
//!   through a switchover, system flags (maintenance modes).
//! - [`observe`]: the dashboard's status and analytics reads, message traces.
//! - [`kafka`]: what the Kafka front door stores beyond queues: partition counts, producer
//!   ids, group offsets as cursors, offsets by time.
//! - [`transaction`]: `POST /api/v1/transaction` — pushes, acks and the KV and timer riders in
//!   one PostgreSQL transaction (it composes the groups above, so it sits beside them).
//! - [`error`]: whether a database error means PostgreSQL is away.
//!
//! A group names another group's items by their full path (`crate::storage::push::commit`);
//! the imports between groups point one way (`scripts/check-layers` checks it).

pub mod begin;
pub mod cluster;
pub mod consume;
pub mod error;
pub mod kafka;
pub mod kv;
pub mod observe;
pub mod push;
pub mod queues;
pub mod segments;
pub mod streams;
pub mod timers;
pub mod transaction;

use std::time::Duration;

use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::storage::cluster::hosts::Primary;

use crate::settings::Settings;
pub use crate::storage::error::StorageError;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies the migrations that are not applied yet (brokers starting together take turns on
/// the migrator's advisory lock).
///
/// # Errors
///
/// [`StorageError::Database`] when a statement failed or PostgreSQL is away (see
/// [`StorageError::is_unreachable`]), [`StorageError::Migrate`] for anything else.
pub async fn migrate(pool: &PgPool) -> Result<(), StorageError> {
    MIGRATOR.run(pool).await.map_err(StorageError::from)
}

/// The hosts of `url` (one, or several for a multi-host URL) with the session options of
/// [`connect_options`], the first one current.
///
/// # Errors
///
/// When the URL does not parse.
pub fn primary(url: &str, settings: &Settings) -> Result<Arc<Primary>, StorageError> {
    let split = cluster::hosts::split_url(url)?;
    let options = connect_options(url, settings)?;
    Ok(Arc::new(Primary::new(
        &split,
        options,
        settings.connect_timeout,
    )))
}

/// Connection options for `url` with the session timeouts from `settings`; for a multi-host
/// URL ([`cluster::hosts::split_url`]), the options of its first host.
///
/// # Errors
///
/// When the URL does not parse.
pub fn connect_options(url: &str, settings: &Settings) -> Result<PgConnectOptions, StorageError> {
    let options: PgConnectOptions = cluster::hosts::split_url(url)?.first.parse()?;
    Ok(options.application_name("queen-broker").options([
        (
            "statement_timeout",
            format!("{}", settings.statement_timeout.as_millis()),
        ),
        (
            "lock_timeout",
            format!("{}", settings.lock_timeout.as_millis()),
        ),
    ]))
}

/// The pool of leasing pops: their statements (claims, releases, the scan watermark) commit
/// without waiting for the WAL flush (`synchronous_commit = off`). A claim lost in a crash only
/// means the lease was never taken: its messages are handed out again, as after a lease
/// expiry. Anything that must survive a crash — acks, autoAck pops, pushes — never runs here;
/// and a later durable commit (the ack) flushes the claim's WAL with its own.
///
/// Unlike the shared pool it does not ping a connection before handing it out (sqlx's
/// `test_before_acquire`): that was one more round trip to PostgreSQL for every pop. A
/// connection that died meanwhile fails its statement instead, sqlx drops it, and the pop
/// answers as for any unreachable moment (503, which clients retry).
pub fn lease_pool(primary: &Arc<Primary>, settings: &Settings) -> PgPool {
    async_commit_pool(primary, settings, settings.db_pool_size)
}

/// The pool of the grouped hand-off claims ([`consume::claim_group`]): a connection per worker (each
/// keeps its own, [`consume::conns::KeptConn`]) and one for releasing the leases claimed ahead that no
/// pop took ([`consume::ahead`]), with asynchronous commit like the lease pool's, but apart from it
/// (a pop that runs a statement holds a lease-pool connection while it waits), and generic
/// plans (see [`ack_pool`]).
pub fn claim_pool(primary: &Arc<Primary>, settings: &Settings, workers: usize) -> PgPool {
    let options = primary.options().options([ASYNC_COMMIT, GENERIC_PLANS]);
    unchecked_pool(
        primary,
        settings,
        u32::try_from(workers.max(1) + 1).unwrap_or(2),
        options,
    )
}

/// `size` connections whose commits do not wait for their WAL flush (leases).
fn async_commit_pool(primary: &Arc<Primary>, settings: &Settings, size: u32) -> PgPool {
    let options = primary.options().options([ASYNC_COMMIT]);
    unchecked_pool(primary, settings, size, options)
}

/// The pool of the grouped acks ([`consume::ack_group`]): a connection per worker, which it keeps
/// ([`consume::conns::KeptConn`]), durable commits like the shared pool's.
///
/// Both grouped pools (this one and [`claim_pool`]) run their statements with PostgreSQL's
/// generic plan (`plan_cache_mode = force_generic_plan`). A grouped statement takes its rows
/// from arrays (`unnest($1::int8[], …)`): with the arrays' values in hand the planner's
/// estimate of a custom plan is always a little cheaper than the generic plan's guess of ten
/// rows, so PostgreSQL kept planning it afresh at every execution (≈ 0.18 ms a call, more than
/// the statement's own execution; docs/history/benchmarks.md, sixteenth run). The generic plan follows
/// the table's statistics: it hashes a small consumer table and probes a large one by key.
pub fn ack_pool(primary: &Arc<Primary>, settings: &Settings, workers: usize) -> PgPool {
    let options = primary.options().options([GENERIC_PLANS]);
    unchecked_pool(
        primary,
        settings,
        u32::try_from(workers.max(1)).unwrap_or(1),
        options,
    )
}

/// The session setting of commits that do not wait for their WAL flush.
const ASYNC_COMMIT: (&str, &str) = ("synchronous_commit", "off");

/// The session setting that makes PostgreSQL run a prepared statement's generic plan (the
/// grouped pools above, and the committers' own connections: [`push::commit::PgStore`]).
pub(crate) const GENERIC_PLANS: (&str, &str) = ("plan_cache_mode", "force_generic_plan");

/// `size` connections with `options`, not pinged before they are handed out (a connection that
/// died fails its statement instead, and sqlx drops it).
fn unchecked_pool(
    primary: &Arc<Primary>,
    settings: &Settings,
    size: u32,
    options: PgConnectOptions,
) -> PgPool {
    tracked(
        primary,
        pool_options(primary)
            .test_before_acquire(false)
            .max_connections(size)
            .acquire_timeout(settings.connect_timeout.max(Duration::from_millis(500)))
            .connect_lazy_with(options),
    )
}

/// The pool of the heavy admin reads (`/api/v1/resources/*`, `/api/v1/messages`, the DLQ and
/// consumer-group listings): `QUEEN_ADMIN_POOL_SIZE` connections whose statements stop after
/// `QUEEN_ADMIN_STATEMENT_TIMEOUT_MS`. Reads that pile up wait here (and get 503 when they wait
/// too long), so they can never take the shared pool's connections from `/health`, the
/// write path or the background work.
pub fn admin_pool(primary: &Arc<Primary>, settings: &Settings) -> PgPool {
    let timeout = settings.admin_statement_timeout.as_millis().to_string();
    tracked(
        primary,
        pool_options(primary)
            .max_connections(settings.admin_pool_size.max(1))
            .acquire_timeout(
                settings
                    .admin_statement_timeout
                    .max(Duration::from_millis(500)),
            )
            .connect_lazy_with(primary.options().options([("statement_timeout", timeout)])),
    )
}

/// The shared pool (health, acks, admin and background work); committers have their own
/// connections. It checks a connection before handing it out (sqlx's `test_before_acquire`),
/// so `/health` never reports a connection that died during an outage as PostgreSQL away.
pub fn pool(primary: &Arc<Primary>, settings: &Settings) -> PgPool {
    tracked(
        primary,
        pool_options(primary)
            .max_connections(settings.db_pool_size)
            .acquire_timeout(settings.connect_timeout.max(Duration::from_millis(500)))
            .connect_lazy_with(primary.options()),
    )
}

/// Pool options that drop a connection opened before the last primary switch instead of
/// handing it out (it may be on the old host, read-only or gone).
fn pool_options(primary: &Arc<Primary>) -> PgPoolOptions {
    // Only the switch time, never the `Primary` (which holds the pool: a cycle).
    let mark = primary.switch_mark();
    PgPoolOptions::new().before_acquire(move |_conn, meta| {
        let fresh = !mark.opened_before_switch(meta.age);
        Box::pin(async move { Ok(fresh) })
    })
}

/// Registers `pool` with `primary`, so its connect options follow a switch.
fn tracked(primary: &Arc<Primary>, pool: PgPool) -> PgPool {
    primary.track(&pool);
    pool
}
