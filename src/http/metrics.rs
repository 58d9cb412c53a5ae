//! `GET /metrics` (JSON, the shape Queen's SDK `admin.metrics()` reads) and
//! `GET /metrics/prometheus` (text exposition): uptime, pool, spool depth, replay progress, how
//! long PostgreSQL has been unreachable, maintenance mode and live partition actors.
//! Both are computed on request from the broker's own counters; neither touches the database.

use std::sync::OnceLock;
use std::time::Instant;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use prometheus::{Encoder, IntGauge, Opts, Registry, TextEncoder};
use serde_json::json;

use crate::state::AppState;

/// When the broker started (the first call fixes it; `app::start` makes that call).
pub fn started() -> Instant {
    static STARTED: OnceLock<Instant> = OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

/// The process's resident set size in bytes (Linux), 0 elsewhere.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

struct Snapshot {
    uptime_secs: u64,
    pool_size: u32,
    pool_idle: usize,
    spool_records: u64,
    spool_bytes: u64,
    replayed: u64,
    db_unreachable_secs: u64,
    db_down: bool,
    maintenance: bool,
    pop_maintenance: bool,
    partition_actors: usize,
    inflight_bytes: usize,
    commit_backlog: usize,
}

fn snapshot(state: &AppState) -> Snapshot {
    let spool = &state.spool.state;
    Snapshot {
        uptime_secs: started().elapsed().as_secs(),
        pool_size: state.pool.size(),
        pool_idle: state.pool.num_idle(),
        spool_records: spool.records(),
        spool_bytes: spool.bytes(),
        replayed: spool.replayed(),
        db_unreachable_secs: spool.db_down_for().map_or(0, |d| d.as_secs()),
        db_down: spool.db_down_for().is_some(),
        maintenance: spool.maintenance(),
        pop_maintenance: state.flags.pop_maintenance(),
        partition_actors: state.registry.len(),
        inflight_bytes: crate::state::inflight_bytes(state),
        commit_backlog: state.committers.backlog(),
    }
}

/// `GET /metrics`.
pub async fn json(state: web::Data<AppState>) -> HttpResponse {
    let s = snapshot(&state);
    HttpResponse::Ok().json(json!({
        "uptime": s.uptime_secs,
        "requests": { "total": 0, "rate": 0 },
        "messages": { "total": 0, "rate": 0 },
        "database": {
            "poolSize": s.pool_size,
            "idleConnections": s.pool_idle,
            "waitingRequests": 0,
        },
        "memory": { "rss": rss_bytes(), "heapTotal": 0, "heapUsed": 0, "external": 0, "arrayBuffers": 0 },
        "cpu": { "user": 0, "system": 0 },
        "spool": {
            "records": s.spool_records,
            "bytes": s.spool_bytes,
            "replayed": s.replayed,
            "dbUnreachableSeconds": s.db_unreachable_secs,
            "maintenanceMode": s.maintenance,
            "popMaintenanceMode": s.pop_maintenance,
        },
        "partitionActors": s.partition_actors,
        "inflightBytes": s.inflight_bytes,
        "commitBacklogItems": s.commit_backlog,
    }))
}

/// `GET /metrics/prometheus`.
pub async fn prometheus(state: web::Data<AppState>) -> HttpResponse {
    let s = snapshot(&state);
    let registry = Registry::new();
    let gauges: [(&str, &str, i64); 12] = [
        (
            "queen_uptime_seconds",
            "seconds since the broker started",
            s.uptime_secs as i64,
        ),
        (
            "queen_db_pool_size",
            "connections of the shared pool",
            i64::from(s.pool_size),
        ),
        (
            "queen_db_pool_idle",
            "idle connections of the shared pool",
            s.pool_idle as i64,
        ),
        (
            "queen_file_buffer_pending",
            "items in the spool not yet replayed",
            s.spool_records as i64,
        ),
        (
            "queen_file_buffer_bytes",
            "bytes of spool files on disk",
            s.spool_bytes as i64,
        ),
        (
            "queen_file_buffer_replayed_total",
            "items replayed from the spool since start",
            s.replayed as i64,
        ),
        (
            "queen_file_buffer_db_healthy",
            "1 unless commits currently fail to reach PostgreSQL",
            i64::from(!s.db_down),
        ),
        (
            "queen_db_unreachable_seconds",
            "how long commits have failed to reach PostgreSQL",
            s.db_unreachable_secs as i64,
        ),
        (
            "queen_maintenance_mode_enabled",
            "1 while push maintenance mode is on",
            i64::from(s.maintenance),
        ),
        (
            "queen_partition_actors",
            "live partition actors",
            s.partition_actors as i64,
        ),
        (
            "queen_inflight_bytes",
            "request bytes held by the write path",
            s.inflight_bytes as i64,
        ),
        (
            "queen_commit_backlog_items",
            "items handed to committers and not yet committed",
            s.commit_backlog as i64,
        ),
    ];
    for (name, help, value) in gauges {
        let gauge =
            IntGauge::with_opts(Opts::new(name, help)).expect("static metric names are valid");
        gauge.set(value);
        registry
            .register(Box::new(gauge))
            .expect("metric names are unique");
    }
    let mut body = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut body) {
        tracing::error!(error = %e, "cannot encode metrics");
        return HttpResponse::InternalServerError()
            .json(json!({ "error": "cannot encode metrics" }));
    }
    HttpResponse::Ok()
        .insert_header((
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        ))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}
