//! What every request handler can reach ([`AppState`]), and the small shared pieces of it that
//! more than one handler or background task uses: admission accounting ([`Inflight`],
//! [`admit`]) and the maintenance flags every broker follows ([`Flags`], [`read_flags`]).
//!
//! Sits above storage and the actors and below auth and http: it never imports a handler,
//! the auth gate or the wiring in `app`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use broker_actors::committer::CommitterPool;
use broker_actors::registry::Registry;
use broker_actors::spool::SpoolHandle;
use sqlx::PgPool;

use crate::ephemeral::Store as EphemeralStore;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::storage::cluster::hosts::Primary;
use crate::storage::consume::ack_group::AckGroup;
use crate::storage::consume::ahead::AheadLeases;
use crate::storage::consume::autopilot::Autopilot;
use crate::storage::consume::claim_group::ClaimGroup;
use crate::storage::consume::handoff::Handoffs;
use crate::storage::segments::cache::SegmentCache;
use crate::storage::segments::crypto::PayloadKey;
use crate::storage::{cluster::system, StorageError};
use crate::wake::WakeHub;

/// Request bytes currently held by the write path.
#[derive(Default)]
pub struct Inflight {
    /// Bytes admitted and not yet answered.
    pub bytes: AtomicUsize,
}

/// Flags every broker follows, as last read from PostgreSQL (push maintenance lives in the
/// spool's state, next to the actors that act on it).
#[derive(Default)]
pub struct Flags {
    pop_maintenance: AtomicBool,
    generation: AtomicU64,
}

impl Flags {
    /// Whether pop maintenance mode is on.
    pub fn pop_maintenance(&self) -> bool {
        self.pop_maintenance.load(Ordering::Acquire)
    }

    /// Sets pop maintenance mode.
    pub fn set_pop_maintenance(&self, on: bool) {
        self.pop_maintenance.store(on, Ordering::Release);
    }

    /// Marks a local change, so a poll that read the database before it does not undo it.
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// How many local changes there have been (a poll compares it before and after its read).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// What every request handler can reach.
pub struct AppState {
    /// Partition actors.
    pub registry: Registry,
    /// The shared pool.
    pub pool: PgPool,
    /// The pool of heavy admin reads (`storage::admin_pool`).
    pub admin_pool: PgPool,
    /// The pool of leasing pops (asynchronous commit, see `storage::lease_pool`).
    pub lease_pool: PgPool,
    /// Settings.
    pub settings: Arc<Settings>,
    /// Admission accounting.
    pub inflight: Arc<Inflight>,
    /// Body bytes being received (`QUEEN_MAX_READING_BYTES`, see `http::body`).
    pub reading: Arc<AtomicUsize>,
    /// Committers' backlog.
    pub committers: CommitterPool,
    /// The spool (depth, maintenance mode).
    pub spool: SpoolHandle,
    /// Shared flags.
    pub flags: Arc<Flags>,
    /// Waiting pops, woken by pushes (here and, via LISTEN, on other brokers).
    pub wake: Arc<WakeHub>,
    /// This broker's id, recorded as the owner of the leases it hands out.
    pub broker_id: String,
    /// Committed segments and handed-out lease ranges this broker knows (consume path).
    pub cache: Arc<SegmentCache>,
    /// This broker's metrics registry.
    pub metrics: Arc<Metrics>,
    /// The last hour of rates, backlogs, spool and commit latency (`crate::history`).
    pub history: Arc<crate::history::History>,
    /// The key of encrypted queues (`QUEEN_ENCRYPTION_KEY`), if set.
    pub payload_key: Option<PayloadKey>,
    /// Partitions this broker's acks released with messages left, for the next pops
    /// (`storage::consume::handoff`).
    pub handoffs: Arc<Handoffs>,
    /// Fast acks grouped into shared commits (`storage::consume::ack_group`).
    pub ack_group: AckGroup,
    /// Hand-off claims of the pops, grouped into shared statements.
    pub claims: ClaimGroup,
    /// Leases claimed for the next pop while an ack commits (`storage::consume::ahead`).
    pub ahead: Arc<AheadLeases>,
    /// What the pop autopilot learnt, per pop scope and group (`storage::consume::autopilot`).
    pub autopilot: Arc<Autopilot>,
    /// The database hosts and which one is the primary now (`storage::cluster::hosts`).
    pub primary: Arc<Primary>,
    /// Partitions stopped in front of a message this broker's key cannot open.
    pub undecryptable: Arc<crate::storage::queues::undecryptable::Stops>,
    /// This broker's ephemeral queues (memory only; `crate::ephemeral`).
    pub ephemeral: Arc<EphemeralStore>,
    /// The Kafka groups this broker coordinates, for the views (`crate::kafka` fills it).
    pub kafka_members: Arc<KafkaMembership>,
}

/// One member of a Kafka group, as the views show it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KafkaMember {
    /// The member id the coordinator gave it.
    pub member_id: String,
    /// Its static membership id, if any.
    pub instance_id: Option<String>,
    /// The partitions its assignment names, per topic (empty when the assignment is not the
    /// consumer protocol's or not made yet).
    pub assigned: Vec<(String, Vec<i32>)>,
}

/// One Kafka group this broker coordinates.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KafkaGroupMembers {
    /// Group id.
    pub group: String,
    /// `Empty`, `PreparingRebalance`, `CompletingRebalance` or `Stable`.
    pub state: &'static str,
    /// Generation.
    pub generation: i32,
    /// The chosen protocol (assignor), if any.
    pub protocol: Option<String>,
    /// The leader's member id, if any.
    pub leader: Option<String>,
    /// Its members.
    pub members: Vec<KafkaMember>,
}

/// The Kafka groups this broker coordinates (memory only: docs/kafka.md), read through a
/// function the Kafka listener sets when it starts, so the HTTP views can show it without
/// knowing the listener.
#[derive(Default)]
pub struct KafkaMembership {
    source: std::sync::OnceLock<Box<dyn Fn() -> Vec<KafkaGroupMembers> + Send + Sync>>,
}

impl KafkaMembership {
    /// Called once by the Kafka listener; a second call is ignored.
    pub fn set(&self, source: Box<dyn Fn() -> Vec<KafkaGroupMembers> + Send + Sync>) {
        let _ = self.source.set(source);
    }

    /// The groups with members here, by group id; `None` when the Kafka listener is off.
    pub fn groups(&self) -> Option<Vec<KafkaGroupMembers>> {
        self.source.get().map(|f| f())
    }
}

/// Bytes currently admitted (for metrics and tests).
pub fn inflight_bytes(state: &AppState) -> usize {
    state.inflight.bytes.load(Ordering::Relaxed)
}

/// Holds request bytes against `QUEEN_MAX_INFLIGHT_BYTES` until dropped.
pub struct Admission {
    state: Arc<Inflight>,
    bytes: usize,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Memory one accepted item costs beyond its bytes while a push is served: the parsed item,
/// the write-path item, its verdict, its result and its share of the response (measured with
/// the bench's many-small-items push: ≈ 0.7 KiB, rounded up).
pub const ITEM_MEMORY_BYTES: usize = 1024;

/// The memory a push of `body_bytes` holding `items` items is admitted for: the body and the
/// payload copies made from it (× 2) plus [`ITEM_MEMORY_BYTES`] per item. This, not the body
/// size alone, is what `QUEEN_MAX_INFLIGHT_BYTES` bounds, so a body of a million tiny items
/// counts for what it really costs.
pub fn push_cost(body_bytes: usize, items: usize) -> usize {
    body_bytes
        .saturating_mul(2)
        .saturating_add(items.saturating_mul(ITEM_MEMORY_BYTES))
}

/// Admits `cost` more bytes when the total stays within `limit`; `None` means "overloaded,
/// retry later". A cost above `limit` alone is never admitted (the caller answers 413).
pub fn admit(inflight: &Arc<Inflight>, cost: usize, limit: usize) -> Option<Admission> {
    let before = inflight.bytes.fetch_add(cost, Ordering::Relaxed);
    let admission = Admission {
        state: inflight.clone(),
        bytes: cost,
    };
    (before.saturating_add(cost) <= limit).then_some(admission)
}

/// Reads (push maintenance, pop maintenance) from PostgreSQL.
///
/// # Errors
///
/// Any database error.
pub async fn read_flags(pool: &PgPool) -> Result<(bool, bool), StorageError> {
    let push = system::flag(pool, system::MAINTENANCE).await?;
    let pop = system::flag(pool, system::POP_MAINTENANCE).await?;
    Ok((push, pop))
}
