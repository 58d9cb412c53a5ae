//! Several brokers, one Kafka cluster (docs/kafka.md, "Several brokers"). Every broker with a
//! Kafka listener registers in PostgreSQL under a node id of its own with the address clients
//! reach it at (`QUEEN_KAFKA_ADVERTISED_HOST` and its port), and keeps that registration alive
//! with a lease; Metadata lists the brokers whose lease runs.
//!
//! Each consumer group is coordinated by exactly one broker: the one holding the group's lease
//! in `queen.kafka_coordinators`. FindCoordinator (and a group request reaching a broker that
//! does not hold the group yet) claims a group nobody holds or whose lease ran out; the holder
//! renews every third of `QUEEN_KAFKA_COORDINATOR_LEASE_MS` while it has the group in memory;
//! another broker answers group requests with `NOT_COORDINATOR`, so the client asks
//! FindCoordinator again. When a holder dies its lease runs out, the next FindCoordinator hands
//! the group to another broker and its members join there (offsets are in PostgreSQL, so they
//! resume from the last commit). Leases are PostgreSQL's clock; a broker counts its own hold
//! from the moment it *sent* the claim or renewal and gives the group up at 90 % of the lease,
//! so it stops coordinating before anyone else may start.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::kafka::{code, Kafka};
use crate::storage::kafka::coordinators::{self as store, BrokerRow, Claim};
use crate::storage::StorageError;

/// Brokers and group leases that ran out longer ago than this are deleted.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// How often the deletion above runs (on each broker).
const FORGET_EVERY: Duration = Duration::from_secs(600);
/// How long a clean stop waits for PostgreSQL to take the release.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// Where this broker stands in the cluster.
pub struct Cluster {
    /// Its node id, -1 until registered.
    node: AtomicI32,
    /// Set by a clean stop: nothing is claimed or renewed any more.
    stopping: AtomicBool,
    /// The brokers whose lease ran at the last renewal.
    brokers: Mutex<Vec<BrokerRow>>,
}

impl Cluster {
    /// A broker not registered yet.
    pub fn new() -> Self {
        Self {
            node: AtomicI32::new(-1),
            stopping: AtomicBool::new(false),
            brokers: Mutex::new(Vec::new()),
        }
    }

    /// This broker's node id, once registered.
    pub fn node_id(&self) -> Option<i32> {
        let node = self.node.load(Ordering::SeqCst);
        (node >= 0).then_some(node)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}

/// This broker as the cluster lists it (`None` until registered).
pub fn me(kafka: &Kafka) -> Option<BrokerRow> {
    kafka.cluster.node_id().map(|node_id| BrokerRow {
        node_id,
        host: kafka.settings.advertised_host.clone(),
        port: i32::from(kafka.port),
    })
}

/// The brokers Metadata lists: those alive at the last renewal, and always this one (empty
/// until it is registered).
pub fn brokers(kafka: &Kafka) -> Vec<BrokerRow> {
    let Some(me) = me(kafka) else {
        return Vec::new();
    };
    let mut listed: Vec<BrokerRow> = kafka
        .cluster
        .brokers
        .lock()
        .expect("Kafka broker list lock poisoned")
        .iter()
        .filter(|b| b.node_id != me.node_id)
        .cloned()
        .collect();
    listed.push(me);
    listed.sort_by_key(|b| b.node_id);
    listed
}

/// Registers this broker (a node id, its address, a lease).
///
/// # Errors
///
/// Any database error.
pub async fn register(kafka: &Kafka) -> Result<i32, StorageError> {
    let mut conn = kafka.state.pool.acquire().await?;
    let host = &kafka.settings.advertised_host;
    let port = i32::from(kafka.port);
    let registered =
        store::register_broker(&mut conn, host, port, kafka.settings.coordinator_lease).await?;
    kafka
        .cluster
        .node
        .store(registered.node_id, Ordering::SeqCst);
    if registered.same_address > 0 {
        tracing::warn!(node_id = registered.node_id, %host, port,
            others = registered.same_address,
            "another Kafka broker on this database is registered at the same address: a restart \
             within QUEEN_KAFKA_COORDINATOR_LEASE_MS (it goes when its lease runs out), or two \
             brokers advertising one address (set QUEEN_KAFKA_ADVERTISED_HOST to an address \
             clients reach each broker at)");
    }
    tracing::info!(node_id = registered.node_id, %host, port, reused = registered.reused,
        "Kafka broker registered");
    Ok(registered.node_id)
}

/// The broker coordinating `group`: this one when it holds the group, or just claimed it
/// (nobody held it, or the holder's lease ran out); else the holder. The error is the Kafka
/// code to answer (`COORDINATOR_NOT_AVAILABLE`, retriable) when that cannot be known now.
pub async fn coordinator_of(kafka: &Kafka, group: &str) -> Result<BrokerRow, i16> {
    let me = me(kafka).ok_or(code::COORDINATOR_NOT_AVAILABLE)?;
    if kafka.groups.holds(group) {
        return Ok(me);
    }
    if kafka.cluster.stopping() {
        return Err(code::COORDINATOR_NOT_AVAILABLE);
    }
    let lease = kafka.settings.coordinator_lease;
    let claimed = async {
        let mut conn = kafka.state.pool.acquire().await?;
        let sent = Instant::now();
        let claim = store::claim_group(&mut conn, group, me.node_id, lease).await?;
        Ok::<_, StorageError>((claim, sent))
    }
    .await;
    match claimed {
        Ok((Some(Claim::Held), sent)) => {
            kafka.groups.hold(group, held_until(sent, lease));
            tracing::debug!(%group, node_id = me.node_id, "Kafka group coordinated here");
            Ok(me)
        }
        Ok((Some(Claim::Other(holder)), _)) => Ok(holder),
        Ok((None, _)) => Err(code::COORDINATOR_NOT_AVAILABLE),
        Err(e) => {
            tracing::warn!(%group, error = %e, "Kafka group coordinator could not be found");
            Err(code::COORDINATOR_NOT_AVAILABLE)
        }
    }
}

/// `NONE` when this broker coordinates `group` (claiming it if nobody does), else the code a
/// group request answers: `NOT_COORDINATOR` (another broker does: the client asks
/// FindCoordinator again) or `COORDINATOR_NOT_AVAILABLE`.
pub async fn coordinate(kafka: &Kafka, group: &str) -> i16 {
    match coordinator_of(kafka, group).await {
        Ok(b) if Some(b.node_id) == kafka.cluster.node_id() => code::NONE,
        Ok(_) => code::NOT_COORDINATOR,
        Err(code) => code,
    }
}

/// Until when this broker may act on a lease of `lease` it asked for at `sent`.
fn held_until(sent: Instant, lease: Duration) -> Instant {
    sent + lease.mul_f64(0.9)
}

/// Renews this broker's registration and its groups' leases every third of the lease, gives up
/// the groups another broker took meanwhile, and refreshes the broker list; registers first
/// when the start-up registration failed. Runs until the runtime stops or a clean stop.
pub async fn keep(kafka: Arc<Kafka>) {
    let mut every = tokio::time::interval(kafka.settings.coordinator_lease / 3);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut forgot = Instant::now();
    loop {
        every.tick().await;
        if kafka.cluster.stopping() {
            return;
        }
        let forget = forgot.elapsed() >= FORGET_EVERY;
        match renew(&kafka, forget).await {
            Ok(()) => {
                if forget {
                    forgot = Instant::now();
                }
                if failing {
                    tracing::info!("Kafka coordinator leases renewed again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e,
                        "Kafka coordinator leases could not be renewed; groups whose hold runs \
                         out are given up (their members rejoin once a broker holds them)");
                }
                failing = true;
            }
        }
    }
}

async fn renew(kafka: &Kafka, forget: bool) -> Result<(), StorageError> {
    let node = match kafka.cluster.node_id() {
        Some(node) => node,
        None => register(kafka).await?,
    };
    let lease = kafka.settings.coordinator_lease;
    let mut conn = kafka.state.pool.acquire().await?;
    let sent = Instant::now();
    if !store::renew_broker(&mut conn, node, lease).await? {
        // Gone: released by a clean stop (then nothing is put back), or forgotten after an
        // outage longer than FORGET_AFTER (then the groups went with it).
        if kafka.cluster.stopping() {
            return Ok(());
        }
        let port = i32::from(kafka.port);
        store::reinstate_broker(
            &mut conn,
            node,
            &kafka.settings.advertised_host,
            port,
            lease,
        )
        .await?;
        tracing::info!(node_id = node, "Kafka broker registration put back");
    }
    let held = kafka.groups.held();
    let renewed = store::renew_groups(&mut conn, node, &held, lease).await?;
    kafka.groups.hold_all(&renewed, held_until(sent, lease));
    let lost: Vec<String> = held.into_iter().filter(|g| !renewed.contains(g)).collect();
    if !lost.is_empty() {
        tracing::warn!(groups = ?lost,
            "Kafka groups are coordinated by another broker now: their members rejoin there");
        kafka.groups.give_up(&lost);
    }
    let alive = store::alive_brokers(&mut conn).await?;
    *kafka
        .cluster
        .brokers
        .lock()
        .expect("Kafka broker list lock poisoned") = alive;
    if forget {
        let gone = store::forget_expired(&mut conn, FORGET_AFTER).await?;
        if gone > 0 {
            tracing::info!(
                rows = gone,
                "expired Kafka brokers and group leases deleted"
            );
        }
    }
    Ok(())
}

/// A clean stop: gives up every group (members waiting in a join or sync are told
/// `NOT_COORDINATOR`) and deletes this broker's registration with its leases, so the other
/// brokers take the groups at once instead of after the lease.
pub async fn release(kafka: &Kafka) {
    kafka.cluster.stopping.store(true, Ordering::SeqCst);
    kafka.groups.give_up_all();
    let Some(node) = kafka.cluster.node_id() else {
        return;
    };
    let released = tokio::time::timeout(RELEASE_WITHIN, async {
        let mut conn = kafka.state.pool.acquire().await?;
        store::release_broker(&mut conn, node).await
    })
    .await;
    match released {
        Ok(Ok(())) => tracing::info!(node_id = node, "Kafka broker and its groups released"),
        Ok(Err(e)) => {
            tracing::warn!(node_id = node, error = %e,
                "Kafka broker not released: other brokers take its groups once the lease runs out");
        }
        Err(_) => tracing::warn!(node_id = node,
            "Kafka broker not released in time: other brokers take its groups once the lease runs out"),
    }
}
