//! The Kafka front door (docs/kafka.md): a TCP listener beside the HTTP one that speaks the
//! Kafka wire protocol, its codec from the `kafka-protocol` crate, mapped onto the same queues,
//! partitions, offsets and consumer-group cursors. A topic is a queue, Kafka partition *i* is
//! the queue's partition named `i`, and a produce goes through the same partition actors and
//! committers as an HTTP push.
//!
//! - [`conn`]: one connection: frames, the size limit, dispatch, answers in request order.
//! - [`versions`]: ApiVersions, and the answer to an API or version not served.
//! - [`metadata`]: Metadata, CreateTopics, DeleteTopics.
//! - [`produce`]: Produce and InitProducerId (idempotent producers on the exact dedup).
//! - [`fetch`]: Fetch (long poll) and ListOffsets.
//! - [`groups`]: the group coordinator (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//!   LeaveGroup) and OffsetCommit/OffsetFetch on the groups' cursors.
//! - [`cluster`]: the brokers on one database as one Kafka cluster: node ids, the broker list,
//!   and which broker coordinates each group (leases in PostgreSQL).
//! - [`sasl`]: SaslHandshake and SaslAuthenticate (PLAIN, OAUTHBEARER) with the HTTP gate's
//!   JWT verifier, and where a connection's authentication stands.
//! - [`access`]: the capability each API requires (the HTTP route table's) and its refusal.
//! - [`compression`]: record batches decompressed within a byte budget.
//! - [`record`]: how a record's key, value, headers and timestamp are stored as a payload.
//!
//! Sits beside `http` (never imports it); every SQL statement it needs is in
//! `storage::kafka` and `storage::queues::reads`.

pub mod access;
pub mod cluster;
pub mod compression;
pub mod conn;
pub mod fetch;
pub mod groups;
pub mod metadata;
pub mod produce;
pub mod record;
pub mod sasl;
pub mod versions;

use std::sync::Arc;

use tokio::sync::{OnceCell, Semaphore};

use crate::auth::jwt::Verifier;
use crate::metrics::KafkaMetrics;
use crate::settings::KafkaSettings;
use crate::state::AppState;
use crate::storage::push::dedup::Secret;
use crate::storage::StorageError;

/// Kafka error codes this front door answers (Kafka's `Errors` enumeration).
pub mod code {
    /// No error.
    pub const NONE: i16 = 0;
    /// Unexpected server error.
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    /// The offset is not within the partition's range.
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    /// A record batch that does not decode.
    pub const CORRUPT_MESSAGE: i16 = 2;
    /// The partition has no leader now (retriable: the client asks Metadata again).
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    /// No such topic or partition.
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    /// A request's records are larger than the broker takes at once.
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    /// The request timed out (retriable): the write path is overloaded.
    pub const REQUEST_TIMED_OUT: i16 = 7;
    /// The coordinator is not available (retriable).
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// Another broker coordinates the group: find its coordinator again (retriable).
    pub const NOT_COORDINATOR: i16 = 16;
    /// An invalid topic name.
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    /// The generation is not the group's current one.
    pub const ILLEGAL_GENERATION: i16 = 22;
    /// The member's protocols have nothing in common with the group's.
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    /// An invalid group id.
    pub const INVALID_GROUP_ID: i16 = 24;
    /// The member is not in the group.
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// The session timeout is out of range.
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    /// The group is rebalancing: join again.
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    /// The SASL mechanism is not enabled.
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    /// The API version is not supported.
    pub const UNSUPPORTED_VERSION: i16 = 35;
    /// The topic exists already.
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    /// An invalid partition count.
    pub const INVALID_PARTITIONS: i16 = 37;
    /// A request that is malformed or not allowed.
    pub const INVALID_REQUEST: i16 = 42;
    /// The queue refused the records (`maxSize`, no encryption key).
    pub const POLICY_VIOLATION: i16 = 44;
    /// The database is away and nothing could be spooled (retriable).
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    /// The caller may not use this topic.
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    /// The caller may not use this group.
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    /// The caller may not use this cluster-wide API.
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    /// A SASL message out of turn.
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    /// The SASL credentials were refused.
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
    /// The group does not exist.
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
}

/// What every Kafka connection can reach.
pub struct Kafka {
    /// The broker's shared state (registry, pools, wake hub, settings).
    pub state: Arc<AppState>,
    /// The listener's settings.
    pub settings: KafkaSettings,
    /// The port the listener is bound to (what metadata advertises).
    pub port: u16,
    /// Membership of the groups this broker coordinates (its memory; docs/kafka.md).
    pub groups: groups::Coordinator,
    /// This broker's node id and the other brokers on the database.
    pub cluster: cluster::Cluster,
    /// Request bytes held by all connections, in KiB: bounds memory however many connect.
    pub frame_budget: Semaphore,
    /// The HTTP gate's token verifier; `None` when JWT auth is off (SASL then checks only
    /// the messages' form).
    pub verifier: Option<Arc<Verifier>>,
    /// The database's dedup secret, read once (`storage::push::dedup`).
    secret: OnceCell<Secret>,
    /// The listener's metric families (`queen_kafka_*`).
    pub metrics: KafkaMetrics,
}

impl Kafka {
    /// The Kafka side of a broker.
    pub fn new(
        state: Arc<AppState>,
        settings: KafkaSettings,
        port: u16,
        verifier: Option<Arc<Verifier>>,
    ) -> Self {
        let budget_kib = (state.settings.max_inflight_bytes / 1024).clamp(1, 1 << 28);
        let metrics = state.metrics.kafka();
        Self {
            state,
            settings,
            port,
            groups: groups::Coordinator::default(),
            cluster: cluster::Cluster::new(),
            frame_budget: Semaphore::new(budget_kib),
            verifier,
            secret: OnceCell::new(),
            metrics,
        }
    }

    /// The dedup secret (read from PostgreSQL the first time).
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn secret(&self) -> Result<Secret, StorageError> {
        self.secret
            .get_or_try_init(|| async {
                let mut conn = self.state.pool.acquire().await?;
                crate::storage::push::dedup::secret(&mut conn).await
            })
            .await
            .copied()
    }
}

/// Binds the Kafka listener on `host:port` (`None` when `QUEEN_KAFKA_PORT` is unset).
///
/// # Errors
///
/// The bind error.
pub fn bind(host: &str, settings: &KafkaSettings) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind((host, settings.port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Accepts connections until the runtime stops; each connection is served by its own task on
/// one of `threads` (in turn), at most `QUEEN_MAX_CONNECTIONS` at once (further ones wait in
/// the backlog).
pub async fn serve(
    listener: std::net::TcpListener,
    kafka: Arc<Kafka>,
    threads: Vec<actix_rt::ArbiterHandle>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "the Kafka listener cannot be served");
            return;
        }
    };
    let connections = Arc::new(Semaphore::new(
        kafka.state.settings.max_connections.clamp(1, 1 << 20),
    ));
    let mut next = 0usize;
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, peer)) => {
                let kafka = kafka.clone();
                // Handed over as a std socket: each thread registers it with its own reactor.
                let stream = match stream.into_std() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "Kafka connection could not be handed over");
                        continue;
                    }
                };
                // The connection's future is made on its thread: checking a token may fetch the
                // JWKS with a client that stays on one thread, so the future is not `Send`.
                let connection = move || {
                    tokio::task::spawn_local(async move {
                        match tokio::net::TcpStream::from_std(stream) {
                            Ok(stream) => conn::serve_connection(stream, peer, &kafka).await,
                            Err(e) => tracing::warn!(%peer, error = %e, "Kafka connection dropped"),
                        }
                        drop(permit);
                    });
                };
                let spawned = match threads.get(next % threads.len().max(1)) {
                    Some(thread) => thread.spawn_fn(connection),
                    None => {
                        connection();
                        true
                    }
                };
                if !spawned {
                    tracing::warn!(%peer, "Kafka connection thread stopped; connection dropped");
                }
                next = next.wrapping_add(1);
            }
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "Kafka listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// A topic name Kafka accepts: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}
