//! Wiring: auth key material and the TLS certificate → database (configured, or a private
//! cluster) → migrations → committers and the partition registry → HTTP server (every route
//! behind the auth gate; HTTPS only when a certificate is configured, reloaded on SIGHUP).
//! Shutdown runs the other way: the server stops accepting and answers what is in flight, then
//! the actors' threads stop, then a private cluster stops.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Arbiter};
use actix_web::{web, App, HttpServer};
use broker_actors::committer::{Committer, CommitterLimits, CommitterPool, Serial};
use broker_actors::partition::PartitionLimits;
use broker_actors::registry::Registry;
use broker_actors::spool::replay::Replayer;
use broker_actors::spool::{SpoolActor, SpoolError, SpoolHandle, SpoolState};
use sqlx::PgPool;

use crate::http::{Gate, Gatekeeper};
use crate::memory;
use crate::metrics::Metrics;
use crate::pg::{ClusterError, PrivateCluster};
use crate::settings::Settings;
use crate::state::{read_flags, AppState, Flags, Inflight};
use crate::storage::cluster::hosts::Primary;
use crate::storage::consume::handoff::Handoffs;
use crate::storage::segments::cache::SegmentCache;
use crate::storage::segments::crypto::PayloadKey;
use crate::storage::{self, push::commit::PgStore};
use crate::tls::{CertStore, TlsError};
use crate::wake::{self, WakeHub};

/// Workers applying grouped fast acks (`storage::consume::ack_group`): one, so that what arrives while
/// it commits forms the next group (with two, groups were smaller and pop+ack cost more CPU:
/// 0.84–0.93 of a push per message against 0.77–0.80 with one, same ack latency;
/// docs/history/benchmarks.md).
const ACK_WORKERS: usize = 1;

/// Workers running the grouped hand-off claims of the pops (`storage::consume::claim_group`).
const CLAIM_WORKERS: usize = 2;

/// Kept here for the tests that read it through `app` (it lives in [`crate::state`]).
pub use crate::state::inflight_bytes;

/// Why the broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// PostgreSQL could not be reached or prepared.
    #[error("cannot use PostgreSQL at {target}: {reason} (set PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB or DATABASE_URL)")]
    Database {
        /// Where we looked (password redacted).
        target: String,
        /// What went wrong.
        reason: String,
    },
    /// The private cluster could not be started.
    #[error("no database configured and none answers on localhost:5432; starting a private one failed: {0}")]
    PrivateCluster(#[from] ClusterError),
    /// Auth is on without usable key material.
    #[error("cannot enable authentication: {0}")]
    Auth(#[from] crate::auth::ConfigError),
    /// The certificate or key of the HTTP listener is unusable.
    #[error("cannot serve HTTPS: {0} (check QUEEN_TLS_CERT_FILE and QUEEN_TLS_KEY_FILE)")]
    Tls(#[from] TlsError),
    /// SIGHUP cannot be caught, so the certificate could never be reloaded.
    #[error("cannot watch SIGHUP for certificate reloads: {0}")]
    Hangup(#[source] std::io::Error),
    /// The HTTP listener could not be opened.
    #[error("cannot listen on {addr}: {source} (check HOST and PORT)")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The spool directory is unusable.
    #[error("{0}")]
    Spool(#[from] SpoolError),
    /// The server failed while running.
    #[error("server error: {0}")]
    Server(#[source] std::io::Error),
}

/// A started broker.
pub struct Broker {
    /// The bound HTTP port.
    pub port: u16,
    /// The server future; [`run`] awaits it, tests spawn it.
    pub server: Option<actix_web::dev::Server>,
    /// Stops the server.
    pub handle: actix_web::dev::ServerHandle,
    /// Shared state, for tests and background tasks.
    pub state: web::Data<AppState>,
    /// The database hosts and which one the broker writes to (`storage::cluster::hosts`).
    pub primary: Arc<Primary>,
    /// The listener's certificate when it serves HTTPS (`QUEEN_TLS_*`); SIGHUP reloads it.
    pub tls: Option<Arc<CertStore>>,
    /// The bound Kafka port, when `QUEEN_KAFKA_PORT` is set (docs/kafka.md).
    pub kafka_port: Option<u16>,
    kafka: Option<Arc<crate::kafka::Kafka>>,
    arbiters: Vec<Arbiter>,
    listener: Arc<Mutex<wake::ListenerHandle>>,
    private_cluster: Option<PrivateCluster>,
}

impl Broker {
    /// This broker's Kafka node id, once registered (docs/kafka.md, "Several brokers").
    pub fn kafka_node_id(&self) -> Option<i32> {
        self.kafka.as_ref().and_then(|k| k.cluster.node_id())
    }

    /// A clean stop of the Kafka side: gives up the groups this broker coordinates and deletes
    /// its registration, so other brokers take the groups at once (without it they wait for
    /// the lease to run out, as after a crash).
    pub async fn release_kafka(&self) {
        if let Some(kafka) = &self.kafka {
            crate::kafka::cluster::release(kafka).await;
        }
    }

    /// Stops the actor threads and a private cluster; call after the server has stopped.
    pub fn shutdown(&self) {
        self.primary.stop();
        self.listener.lock().expect("listener lock").stop();
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
        if let Some(cluster) = &self.private_cluster {
            tracing::info!(data_dir = %cluster.data_dir.display(), "stopping the private PostgreSQL");
            if let Err(e) = cluster.stop(false) {
                tracing::warn!(error = %e, "private PostgreSQL did not stop cleanly");
            }
        }
    }
}

/// Starts the broker and serves until SIGTERM/SIGINT.
///
/// # Errors
///
/// [`StartError`] when a dependency is unusable.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    let mut broker = start(settings).await?;
    let server = broker
        .server
        .take()
        .expect("a started broker has its server");
    let result = server.await;
    // Leases claimed ahead for pops that will not come are released, not left to run out; so
    // are the Kafka groups this broker coordinates.
    broker.state.ahead.release_all().await;
    broker.release_kafka().await;
    broker.shutdown();
    result.map_err(StartError::Server)
}

/// Decides which PostgreSQL to use: the configured one, else localhost:5432 if it answers, else
/// a private cluster from the local binaries.
async fn resolve_database(
    settings: &Settings,
) -> Result<(String, Option<PrivateCluster>), StartError> {
    if settings.database_configured {
        return Ok((settings.database.url(), None));
    }
    let probe = settings.private_pg_probe.as_str();
    let local = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(probe),
    )
    .await;
    if matches!(local, Ok(Ok(_))) {
        return Ok((settings.database.url(), None));
    }
    let dir = std::path::absolute(&settings.private_pg_dir)
        .unwrap_or_else(|_| settings.private_pg_dir.clone());
    let port = crate::pg::free_port().map_err(|e| StartError::Database {
        target: "127.0.0.1".into(),
        reason: e.to_string(),
    })?;
    let cluster = PrivateCluster::new(&dir, port)?;
    tracing::info!(
        data_dir = %dir.display(),
        port,
        probe,
        "no database configured and none answers at the probe address: starting a private PostgreSQL"
    );
    let starting = cluster.clone();
    tokio::task::spawn_blocking(move || starting.start(true))
        .await
        .map_err(|e| StartError::Database {
            target: dir.display().to_string(),
            reason: e.to_string(),
        })??;
    Ok((cluster.url("postgres"), Some(cluster)))
}

/// Starts everything and returns once the HTTP listener is bound.
///
/// # Errors
///
/// [`StartError`] when a dependency is unusable.
pub async fn start(settings: Settings) -> Result<Broker, StartError> {
    let settings = Arc::new(settings);
    // Before anything else: a broker that cannot check tokens must not start.
    let gatekeeper = Arc::new(Gatekeeper::new(&settings.jwt, crate::http::routes())?);
    if gatekeeper.enabled() {
        tracing::info!(
            algorithm = settings.jwt.algorithm.name(),
            "JWT authentication is on"
        );
    }
    // Before the database too: a broker whose certificate or key is unusable must not start
    // (and must not fall back to plain HTTP).
    let tls = match &settings.tls {
        Some(files) => Some(CertStore::open(&files.cert_file, &files.key_file)?),
        None => None,
    };
    // The spool first: a broker that cannot spool must not start taking pushes.
    let spool_state = Arc::new(SpoolState::default());
    let spool_actor = SpoolActor::open(&settings.file_buffer_dir, spool_state.clone())?;
    let (url, private_cluster) = resolve_database(&settings).await?;
    let target = format!("{:?}", crate::settings::Database::Url(url.clone()));
    let db_err = |reason: String| StartError::Database {
        target: target.clone(),
        reason,
    };
    let primary = storage::primary(&url, &settings).map_err(|e| db_err(e.to_string()))?;
    if primary.several() {
        // Start on the host that accepts writes; when none does yet, start on the first and
        // let the watcher keep looking (pushes are spooled meanwhile).
        let found = tokio::time::timeout(settings.connect_timeout * 2, primary.find()).await;
        match found {
            Ok(Some(index)) if index != 0 => primary.switch_to(index),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                tracing::warn!(hosts = ?primary.host_list(), "no database host accepts writes at start-up; still looking");
                primary.suspect();
            }
        }
    }
    let options = primary.options();
    let pool = storage::pool(&primary, &settings);
    let lease_pool = storage::lease_pool(&primary, &settings);
    let claim_pool = storage::claim_pool(&primary, &settings, CLAIM_WORKERS);
    let admin_pool = storage::admin_pool(&primary, &settings);
    match tokio::time::timeout(settings.connect_timeout * 2, storage::migrate(&pool)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_unreachable() => {
            defer_migrations(&pool, &target, &e.to_string());
        }
        Ok(Err(e)) => return Err(db_err(e.to_string())),
        Err(_) => defer_migrations(&pool, &target, "connect timed out"),
    }

    let committer_arbiter = Arbiter::new();
    let partition_arbiter = Arbiter::new();
    let memory = memory::limit();
    let ceiling = SegmentCache::ceiling_within(settings.segment_cache_max_bytes, memory);
    if ceiling < settings.segment_cache_max_bytes {
        tracing::info!(
            memory_bytes = memory.unwrap_or(0),
            ceiling_bytes = ceiling,
            configured_bytes = settings.segment_cache_max_bytes,
            "segment cache ceiling lowered to a share of the memory this broker may use"
        );
    }
    let cache = Arc::new(SegmentCache::new(settings.segment_cache_bytes).growing_to(ceiling));
    let metrics = Arc::new(Metrics::new(settings.metrics));
    let payload_key = settings
        .encryption_key
        .as_ref()
        .map(|k| PayloadKey::new(&k.0));
    let mut committers = Vec::with_capacity(settings.committers);
    let serial = Arc::new(Serial::default());
    for id in 0..settings.committers {
        let load = Arc::new(AtomicUsize::new(0));
        let store = PgStore::new(
            options.clone(),
            settings.connect_timeout,
            settings.commit_timeout,
        )
        .with_cache(cache.clone())
        .with_key(payload_key.clone())
        .with_primary(primary.clone());
        let counter = load.clone();
        let observer = metrics.clone();
        let serial = serial.clone();
        let addr = Committer::start_in_arbiter(&committer_arbiter.handle(), move |_| {
            Committer::new(id, store, counter, CommitterLimits::default())
                .with_observer(observer)
                .with_serial(serial)
        });
        committers.push((addr.recipient(), load));
    }
    let committers = CommitterPool::with_serial(committers, settings.committer_spill_items, serial);

    let spool_actor =
        SpoolActor::start_in_arbiter(&committer_arbiter.handle(), move |_| spool_actor);
    let spool = SpoolHandle {
        actor: spool_actor.clone(),
        state: spool_state.clone(),
    };
    let replay_store = PgStore::new(
        options.clone(),
        settings.connect_timeout,
        settings.commit_timeout,
    )
    .with_key(payload_key.clone())
    .with_primary(primary.clone())
    .admitted();
    let replay_state = spool_state.clone();
    let (replay_every, replay_backoff) = (settings.replay_every, settings.replay_backoff);
    Replayer::start_in_arbiter(&committer_arbiter.handle(), move |_| {
        Replayer::new(
            replay_store,
            spool_actor,
            replay_state,
            replay_every,
            replay_backoff,
        )
    });

    let registry = Registry::new(
        vec![partition_arbiter.handle()],
        committers.clone(),
        PartitionLimits {
            max_pending_items: settings.partition_max_pending,
            idle_after: settings.partition_idle,
            max_actors: settings.partition_actors_max,
            ..PartitionLimits::default()
        },
        Some(spool.clone()),
    );
    let flags = Arc::new(Flags::default());
    // Know the maintenance flags before the first request (the poller keeps them fresh).
    if let Ok(Ok((push, pop))) =
        tokio::time::timeout(settings.connect_timeout, read_flags(&pool)).await
    {
        spool_state.set_maintenance(push);
        flags.set_pop_maintenance(pop);
    }
    actix_web::rt::spawn(poll_flags(
        pool.clone(),
        spool_state.clone(),
        flags.clone(),
        settings.clone(),
    ));
    actix_web::rt::spawn(report_spool(
        spool_state.clone(),
        settings.spool_report_every,
    ));

    actix_web::rt::spawn(check_key(pool.clone(), payload_key.clone()));
    actix_web::rt::spawn(check_durability(pool.clone()));
    // Tables that grew past what the planner knows of them are analyzed without waiting for
    // autovacuum (storage::cluster::statistics).
    actix_web::rt::spawn(storage::cluster::statistics::keep_loop(pool.clone()));

    actix_web::rt::spawn(storage::push::dedup::sweep_loop(
        pool.clone(),
        settings.dedup_sweep_every,
    ));

    // The KV sweeper (storage::kv::sweep): deletes expired keys in small batches.
    actix_web::rt::spawn(storage::kv::sweep::sweep_loop(
        pool.clone(),
        storage::kv::sweep::SWEEP_EVERY,
    ));

    actix_web::rt::spawn(storage::queues::retention::sweep_loop(
        pool.clone(),
        settings.retention_every,
        settings.retention_batch,
    ));
    let hub = WakeHub::new();
    // Every broker fires due timers (claims are SKIP LOCKED: each timer fires once).
    actix_web::rt::spawn(storage::timers::fire::fire_loop(
        pool.clone(),
        payload_key.clone(),
        hub.clone(),
        spool_state.clone(),
        settings.commit_timeout,
    ));

    // Every written partition is offered to the pops of its queue on this broker.
    let handoffs: Arc<Handoffs> = Arc::default();
    {
        let handoffs = handoffs.clone();
        hub.on_written(Box::new(move |queue, partition_id| {
            handoffs.written(queue, partition_id)
        }));
    }
    let listener = Arc::new(Mutex::new(wake::spawn_listener(
        options.clone(),
        hub.clone(),
    )));
    {
        // After a switchover the LISTEN connection is made again, on the new primary (the
        // old handle stops its thread when dropped).
        // The spool replay need not wait out its back-off either: a host accepts writes.
        let (listener, hub, spool) = (listener.clone(), hub.clone(), spool_state.clone());
        primary.on_switch(move |options| {
            *listener.lock().expect("listener lock") = wake::spawn_listener(options, hub.clone());
            spool.mark_db_up();
        });
    }
    actix_web::rt::spawn(
        primary
            .clone()
            .watch(pool.clone(), settings.primary_check_every),
    );
    actix_web::rt::spawn(
        primary
            .clone()
            .watch_split_brain(pool.clone(), settings.primary_check_every),
    );

    let ack_pool = storage::ack_pool(&primary, &settings, ACK_WORKERS);
    let broker_id = format!("broker-{}", uuid::Uuid::new_v4().simple());
    // A grouped claim or ack statement that PostgreSQL has not answered a second past its own
    // statement_timeout never will (a half-open connection): its worker gives it up.
    let group_answer_within = settings.statement_timeout + Duration::from_secs(1);
    let claims = storage::consume::claim_group::ClaimGroup::start(
        claim_pool,
        broker_id.clone(),
        CLAIM_WORKERS,
        group_answer_within,
    );
    let ahead = storage::consume::ahead::AheadLeases::new(
        claims.clone(),
        handoffs.clone(),
        cache.clone(),
        hub.clone(),
        settings.pop_ahead,
    );
    let ephemeral = Arc::new(crate::ephemeral::Store::new(
        settings.ephemeral_max_bytes,
        Some(metrics.ephemeral()),
    ));
    actix_web::rt::spawn(ephemeral_upkeep(ephemeral.clone(), pool.clone()));
    let history = Arc::new(crate::history::History::new(
        settings.history_interval,
        settings.history_queues,
        settings.metrics,
    ));
    actix_web::rt::spawn(crate::history::sample_loop(
        history.clone(),
        metrics.clone(),
        spool_state.clone(),
        admin_pool.clone(),
        settings.lag_live_pairs,
    ));
    actix_web::rt::spawn(crate::lag::pass_loop(
        admin_pool.clone(),
        settings.lag_live_pairs,
        settings.lag_pass_interval,
    ));
    let state = web::Data::new(AppState {
        registry,
        pool,
        admin_pool,
        lease_pool,
        settings: settings.clone(),
        inflight: Arc::new(Inflight::default()),
        reading: Arc::new(AtomicUsize::new(0)),
        committers,
        spool,
        flags,
        wake: hub,
        broker_id: broker_id.clone(),
        cache,
        metrics,
        history,
        payload_key,
        undecryptable: Arc::default(),
        handoffs,
        ack_group: storage::consume::ack_group::AckGroup::start(
            ack_pool,
            ACK_WORKERS,
            group_answer_within,
        ),
        claims,
        ahead,
        autopilot: Arc::default(),
        primary: primary.clone(),
        ephemeral: ephemeral.clone(),
        kafka_members: Arc::default(),
    });
    let data = state.clone();
    let addr = format!("{}:{}", settings.host, settings.port);
    // The Kafka listener checks SASL tokens with the HTTP gate's verifier (one JWKS cache).
    let verifier = gatekeeper.verifier();
    let server = HttpServer::new(move || {
        let patterns = std::rc::Rc::new(crate::http::route_patterns());
        App::new()
            .app_data(data.clone())
            // The gate runs inside the CORS headers, so its 401/403/404 answers carry them.
            // Inside the gate: path and query values are checked once a caller is admitted.
            .wrap(actix_web::middleware::from_fn(move |req, next| {
                crate::http::inputs::checked(patterns.clone(), req, next)
            }))
            .wrap(Gate::new(gatekeeper.clone()))
            .wrap(actix_web::middleware::from_fn(crate::http::origin::guard))
            .wrap(crate::http::cors_headers())
            // Outermost: every answer (the gate's too) gets a request id and is counted.
            .wrap(actix_web::middleware::from_fn(
                crate::http::observe::observe,
            ))
            .configure(crate::http::configure)
    })
    // A long-poll pop looks whether its client is still there before it claims.
    .on_connect(crate::http::PeerSocket::on_connect)
    .workers(settings.workers)
    .max_connections(connections_per_worker(&settings))
    .shutdown_timeout(30);
    // With a certificate the listener speaks TLS only: a plain-text request fails its handshake.
    let server = match &tls {
        Some(store) => server.bind_rustls_0_23(&addr, store.server_config()),
        None => server.bind(&addr),
    }
    .map_err(|source| StartError::Bind {
        addr: addr.clone(),
        source,
    })?;
    let port = server.addrs().first().map_or(settings.port, |a| a.port());
    if let Some(store) = &tls {
        // Installed before the server runs: from here on SIGHUP reloads, it never kills.
        let reloads = crate::tls::reload_on_hangup(store.clone()).map_err(StartError::Hangup)?;
        actix_web::rt::spawn(reloads);
    }
    let server = server.run();
    let mut arbiters = vec![committer_arbiter, partition_arbiter];
    let (kafka_port, kafka) = match &settings.kafka {
        None => (None, None),
        Some(kafka_settings) => {
            let kafka_addr = format!("{}:{}", settings.host, kafka_settings.port);
            let listener =
                crate::kafka::bind(&settings.host, kafka_settings).map_err(|source| {
                    StartError::Bind {
                        addr: kafka_addr,
                        source,
                    }
                })?;
            let kafka_port = listener
                .local_addr()
                .map_or(kafka_settings.port, |a| a.port());
            let kafka = Arc::new(crate::kafka::Kafka::new(
                state.clone().into_inner(),
                kafka_settings.clone(),
                kafka_port,
                verifier,
            ));
            // The Kafka connections run on threads of their own (as many as the HTTP workers),
            // beside the HTTP workers; the first also accepts and keeps the group clock.
            let kafka_arbiters: Vec<Arbiter> = (0..settings.workers.max(1))
                .map(|_| Arbiter::new())
                .collect();
            let threads = kafka_arbiters.iter().map(Arbiter::handle).collect();
            let members = Arc::downgrade(&kafka);
            kafka.state.kafka_members.set(Box::new(move || {
                members
                    .upgrade()
                    .map(|k| k.groups.snapshot())
                    .unwrap_or_default()
            }));
            // A node id before the first client connects; when PostgreSQL is away the keeper
            // below registers once it answers (Metadata answers LEADER_NOT_AVAILABLE meanwhile).
            let registering = crate::kafka::cluster::register(&kafka);
            match tokio::time::timeout(settings.connect_timeout * 2, registering).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "Kafka broker not registered yet; retrying");
                }
                Err(_) => tracing::warn!("Kafka broker not registered yet (timed out); retrying"),
            }
            let ticking = kafka.clone();
            let keeping = kafka.clone();
            let serving = kafka.clone();
            kafka_arbiters[0].spawn(async move {
                tokio::task::spawn_local(crate::kafka::groups::tick_loop(ticking));
                tokio::task::spawn_local(crate::kafka::cluster::keep(keeping));
                crate::kafka::serve(listener, serving, threads).await;
            });
            arbiters.extend(kafka_arbiters);
            tracing::info!(
                port = kafka_port,
                advertised_host = %kafka_settings.advertised_host,
                node_id = kafka.cluster.node_id(),
                "Kafka listener serving"
            );
            (Some(kafka_port), Some(kafka))
        }
    };
    tracing::info!(
        host = %settings.host,
        port,
        db_host = %options.get_host(),
        db_port = options.get_port(),
        db_hosts = primary.host_list().len(),
        database = %options.get_database().unwrap_or("(the user's name)"),
        private_database = private_cluster.is_some(),
        metrics = settings.metrics,
        tls = tls.is_some(),
        "queen-broker listening"
    );
    Ok(Broker {
        port,
        handle: server.handle(),
        server: Some(server),
        state,
        primary,
        tls,
        kafka_port,
        kafka,
        arbiters,
        listener,
        private_cluster,
    })
}

/// File descriptors kept free of client connections: PostgreSQL connections, spool and
/// watermark files, the LISTEN connection, the JWKS fetch.
const RESERVED_FDS: usize = 256;

/// The soft open-file limit of this process (from `/proc/self/limits`), if it can be read.
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// `QUEEN_MAX_CONNECTIONS`, capped so that client connections can never use up the file
/// descriptors the broker needs for PostgreSQL and the spool, split over the workers (actix
/// counts per worker; connections past the limit wait in the listen backlog).
fn connections_per_worker(settings: &Settings) -> usize {
    let mut total = settings.max_connections;
    if let Some(fds) = open_file_limit() {
        let cap = fds.saturating_sub(RESERVED_FDS).max(fds / 2).max(1);
        if cap < total {
            tracing::info!(
                open_file_limit = fds,
                max_connections = cap,
                "QUEEN_MAX_CONNECTIONS capped below the open-file limit"
            );
            total = cap;
        }
    }
    (total / settings.workers.max(1)).max(1)
}

/// PostgreSQL is away at start-up: serve anyway (pushes go to the spool) and migrate once it
/// answers.
fn defer_migrations(pool: &PgPool, target: &str, reason: &str) {
    tracing::warn!(
        database = target,
        reason,
        "PostgreSQL unreachable at start-up; pushes are spooled until it answers"
    );
    let pool = pool.clone();
    actix_web::rt::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match storage::migrate(&pool).await {
                Ok(()) => {
                    tracing::info!("PostgreSQL answers; migrations are applied");
                    return;
                }
                Err(e) => tracing::debug!(error = %e, "migrations still waiting for PostgreSQL"),
            }
        }
    });
}

/// Follows the maintenance flags stored in PostgreSQL (every broker on the database sees the
/// same); keeps the last known state while the database is away.
async fn poll_flags(
    pool: PgPool,
    spool: Arc<SpoolState>,
    flags: Arc<Flags>,
    settings: Arc<Settings>,
) {
    let mut tick = tokio::time::interval(settings.flag_poll_every);
    let mut last_failure: Option<String> = None;
    loop {
        tick.tick().await;
        let generation = flags.generation();
        match tokio::time::timeout(settings.flag_read_timeout, read_flags(&pool)).await {
            Ok(Ok((push, pop))) => {
                last_failure = None;
                // A local change after the read started wins until the next poll.
                if flags.generation() == generation {
                    if push != spool.maintenance() {
                        tracing::info!(
                            enabled = push,
                            "maintenance mode changed (from the database)"
                        );
                    }
                    spool.set_maintenance(push);
                    flags.set_pop_maintenance(pop);
                }
            }
            // PostgreSQL away (or too slow): keep the last known flags; the spool reports
            // the outage.
            Ok(Err(e)) if e.is_unreachable() => {
                tracing::debug!(error = %e, "maintenance flags unreadable: PostgreSQL is away");
            }
            Err(_) => tracing::debug!("maintenance flags unreadable: PostgreSQL did not answer"),
            // Anything else is worth an operator's look, once per distinct failure.
            Ok(Err(e)) => {
                let text = e.to_string();
                if last_failure.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "reading the maintenance flags failed");
                    last_failure = Some(text);
                }
            }
        }
    }
}

/// Logs spool depth, replay rate and how long PostgreSQL has been unreachable, while any of
/// them is worth saying.
/// Tries the encryption key on a stored sealed message once at start, so a broker started with
/// the wrong key (or none) says so at once, naming a message, instead of at its first pop.
async fn check_key(pool: PgPool, key: Option<PayloadKey>) {
    use crate::storage::segments::key_check::KeyCheck;
    let checked = async {
        let mut conn = pool.acquire().await?;
        storage::segments::key_check::check_key(&mut conn, key.as_ref()).await
    };
    match checked.await {
        Ok(KeyCheck::NothingSealed | KeyCheck::Opens) => {}
        Ok(KeyCheck::Fails {
            message_id,
            queue,
            error,
        }) => tracing::error!(%message_id, %queue, %error,
            "QUEEN_ENCRYPTION_KEY does not open the newest encrypted message of this queue; \
             encrypted messages are not delivered until the broker has the key they were sealed with"),
        Err(e) => tracing::warn!(error = %e, "the encryption key could not be checked at start"),
    }
}

/// Logs what the database's settings promise about a commit answered `queued`
/// (`storage::cluster::durability`): a warning for each guarantee of docs/reliability.md that
/// they cannot give.
async fn check_durability(pool: PgPool) {
    use crate::storage::cluster::durability::{self, Level};
    match durability::read(&pool).await {
        Ok(found) => {
            for (level, text) in found.findings() {
                match level {
                    Level::Warn => tracing::warn!(settings = ?found, "{text}"),
                    Level::Info => tracing::info!("{text}"),
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "the database's durability settings could not be read at start")
        }
    }
}

async fn report_spool(spool: Arc<SpoolState>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut replayed_before = spool.replayed();
    loop {
        tick.tick().await;
        let replayed = spool.replayed();
        let rate = (replayed - replayed_before) as f64 / every.as_secs_f64();
        replayed_before = replayed;
        let down = spool.db_down_for();
        if spool.records() > 0 || down.is_some() || rate > 0.0 {
            tracing::warn!(
                spool_records = spool.records(),
                spool_bytes = spool.bytes(),
                replay_per_sec = rate,
                db_unreachable_secs = down.map(|d| d.as_secs()),
                maintenance = spool.maintenance(),
                "spool status"
            );
        }
    }
}

/// The ephemeral queues' upkeep: loads the declared queues from PostgreSQL (retrying until it
/// answers: they come back declared and empty), then runs lease expiry, TTL and idle-group
/// cleanup every second.
async fn ephemeral_upkeep(store: Arc<crate::ephemeral::Store>, pool: PgPool) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut loaded = false;
    loop {
        tick.tick().await;
        if !loaded {
            let read = async {
                let mut conn = pool.acquire().await?;
                storage::queues::ephemeral::all(&mut conn).await
            };
            match read.await {
                Ok(declared) => {
                    for (queue, options) in declared {
                        match crate::ephemeral::Options::parse(Some(&options)) {
                            Ok(options) => store.ensure(&queue, Some(options)),
                            Err(e) => tracing::warn!(queue = %queue, error = %e,
                                "stored ephemeral options no longer parse; the queue keeps the defaults"),
                        }
                    }
                    loaded = true;
                }
                Err(e) => tracing::debug!(error = %e, "ephemeral declarations not read yet"),
            }
        }
        store.sweep();
    }
}
