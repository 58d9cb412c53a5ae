//! Wiring: database (configured, or a private cluster) → migrations → committers and the
//! partition registry → HTTP server. Shutdown runs the other way: the server stops accepting and
//! answers what is in flight, then the actors' threads stop, then a private cluster stops.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Arbiter};
use actix_web::{web, App, HttpServer};
use broker_actors::committer::{Committer, CommitterLimits, CommitterPool};
use broker_actors::partition::PartitionLimits;
use broker_actors::registry::Registry;
use sqlx::PgPool;

use crate::http::pop::PopPause;
use crate::pg::{ClusterError, PrivateCluster};
use crate::settings::Settings;
use crate::storage::{self, commit::PgStore};
use crate::wake::{self, WakeHub};

/// Request bytes currently held by the write path.
#[derive(Default)]
pub struct Inflight {
    /// Bytes admitted and not yet answered.
    pub bytes: AtomicUsize,
}

/// What every request handler can reach.
pub struct AppState {
    /// Partition actors.
    pub registry: Registry,
    /// The shared pool.
    pub pool: PgPool,
    /// Settings.
    pub settings: Arc<Settings>,
    /// Admission accounting.
    pub inflight: Arc<Inflight>,
    /// Committers' backlog.
    pub committers: CommitterPool,
    /// Waiting pops, woken by pushes (here and, via LISTEN, on other brokers).
    pub wake: Arc<WakeHub>,
    /// This broker's id, recorded as the owner of the leases it hands out.
    pub broker_id: String,
    /// The cached pop-maintenance flag.
    pub pop_pause: PopPause,
}

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
    /// The HTTP listener could not be opened.
    #[error("cannot listen on {addr}: {source} (check HOST and PORT)")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
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
    arbiters: Vec<Arbiter>,
    listener: wake::ListenerHandle,
    private_cluster: Option<PrivateCluster>,
}

impl Broker {
    /// Stops the actor threads and a private cluster; call after the server has stopped.
    pub fn shutdown(&self) {
        self.listener.stop();
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
    tracing::info!(port = broker.port, "queen-broker listening");
    let server = broker
        .server
        .take()
        .expect("a started broker has its server");
    let result = server.await;
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
    let local = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(("127.0.0.1", 5432)),
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
        "no database configured and none answers on localhost:5432: starting a private PostgreSQL"
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
    let (url, private_cluster) = resolve_database(&settings).await?;
    let target = format!("{:?}", crate::settings::Database::Url(url.clone()));
    let db_err = |reason: String| StartError::Database {
        target: target.clone(),
        reason,
    };
    let options = storage::connect_options(&url, &settings).map_err(|e| db_err(e.to_string()))?;
    let pool = storage::pool(options.clone(), &settings);
    storage::MIGRATOR
        .run(&pool)
        .await
        .map_err(|e| db_err(e.to_string()))?;

    let committer_arbiter = Arbiter::new();
    let partition_arbiter = Arbiter::new();
    let mut committers = Vec::with_capacity(settings.committers);
    for id in 0..settings.committers {
        let load = Arc::new(AtomicUsize::new(0));
        let store = PgStore::new(options.clone());
        let counter = load.clone();
        let addr = Committer::start_in_arbiter(&committer_arbiter.handle(), move |_| {
            Committer::new(id, store, counter, CommitterLimits::default())
        });
        committers.push((addr.recipient(), load));
    }
    let committers = CommitterPool::new(committers);
    let registry = Registry::new(
        vec![partition_arbiter.handle()],
        committers.clone(),
        PartitionLimits {
            max_pending_items: settings.partition_max_pending,
            idle_after: settings.partition_idle,
            ..PartitionLimits::default()
        },
    );

    actix_web::rt::spawn(storage::dedup::sweep_loop(
        pool.clone(),
        settings.dedup_sweep_every,
    ));

    let hub = WakeHub::new();
    let listener = wake::spawn_listener(options.clone(), hub.clone());

    let state = web::Data::new(AppState {
        registry,
        pool,
        settings: settings.clone(),
        inflight: Arc::new(Inflight::default()),
        committers,
        wake: hub,
        broker_id: format!("broker-{}", uuid::Uuid::new_v4().simple()),
        pop_pause: PopPause::default(),
    });
    let data = state.clone();
    let addr = format!("{}:{}", settings.host, settings.port);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .wrap(crate::http::cors_headers())
            .configure(crate::http::configure)
    })
    .workers(settings.workers)
    .shutdown_timeout(30)
    .bind(&addr)
    .map_err(|source| StartError::Bind {
        addr: addr.clone(),
        source,
    })?;
    let port = server.addrs().first().map_or(settings.port, |a| a.port());
    let server = server.run();
    Ok(Broker {
        port,
        handle: server.handle(),
        server: Some(server),
        state,
        arbiters: vec![committer_arbiter, partition_arbiter],
        listener,
        private_cluster,
    })
}

/// Bytes currently admitted (for metrics and tests).
pub fn inflight_bytes(state: &AppState) -> usize {
    state.inflight.bytes.load(Ordering::Relaxed)
}
