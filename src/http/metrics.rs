//! `GET /metrics` (JSON, the shape Queen's SDK `admin.metrics()` reads) and
//! `GET /metrics/prometheus` (text exposition). Both read the broker's one registry
//! (`crate::metrics`); the gauges are taken from the state at the scrape. The Prometheus route
//! also counts live leases with one bounded query (Queen's exporter queries once per scrape
//! too); when PostgreSQL does not answer in time the family is left out.

use std::path::Path;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::metrics::{Gauges, StateGauges};
use crate::state::AppState;
use crate::storage::cluster::system;

/// Age of the oldest spool file, from the creation time in its name
/// (`spool-<micros since epoch>-<n>.qspool`); 0 when there is none.
fn oldest_spool_secs(dir: &Path) -> f64 {
    let Ok(files) = broker_actors::spool::list_files(dir) else {
        return 0.0;
    };
    let created = files.first().and_then(|f| {
        let name = f.file_name()?.to_str()?;
        name.strip_prefix("spool-")?
            .split('-')
            .next()?
            .parse::<u64>()
            .ok()
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    created.map_or(0.0, |c| now.saturating_sub(c) as f64 / 1e6)
}

fn gauges(state: &AppState) -> Gauges {
    let spool = &state.spool.state;
    let records = spool.records();
    Gauges {
        pool_size: state.pool.size(),
        pool_idle: state.pool.num_idle(),
        lease_pool_size: state.lease_pool.size(),
        lease_pool_idle: state.lease_pool.num_idle(),
        claim_pool_size: state.claims.pool().size(),
        claim_pool_idle: state.claims.pool().num_idle(),
        ack_pool_size: state.ack_group.pool().size(),
        ack_pool_idle: state.ack_group.pool().num_idle(),
        spool_records: records,
        spool_bytes: spool.bytes(),
        spool_oldest_secs: if records > 0 {
            oldest_spool_secs(&state.settings.file_buffer_dir)
        } else {
            0.0
        },
        replayed: spool.replayed(),
        quarantined: spool.quarantined(),
        db_down_for: spool.db_down_for(),
        maintenance: spool.maintenance(),
        pop_maintenance: state.flags.pop_maintenance(),
        partition_actors: state.registry.len(),
        partition_evictions: state.registry.evicted(),
        database_host: state.primary.current_host(),
        database_switches: state.primary.switches(),
        leases_ahead: {
            let c = state.ahead.counts();
            [c.claimed, c.taken, c.released]
        },
        cache_reads: {
            let r = state.cache.reads();
            [r.hits, r.misses]
        },
        cache_rereads: state.cache.reads().rereads,
        cache_budget: state.cache.budget(),
        inflight_bytes: crate::state::inflight_bytes(state),
        commit_backlog: state.committers.backlog(),
        leases: None,
        backlogs: Vec::new(),
        state: None,
    }
}

/// The history's newest backlogs and 2.x state figures as gauges.
fn with_history(mut g: Gauges, state: &AppState) -> Gauges {
    let latest = state.history.latest();
    g.backlogs = latest.pairs;
    g.state = latest.state.map(|s| StateGauges {
        namespaces: s
            .namespaces
            .into_iter()
            .map(|n| (n.namespace, n.keys, n.bytes))
            .collect(),
        locks_held: s.permits,
        timers: s
            .timers
            .into_iter()
            .map(|t| (t.queue, t.pending, t.late_seconds))
            .collect(),
        streams: s
            .streams
            .into_iter()
            .map(|q| (q.name, q.state_keys, q.state_bytes))
            .collect(),
    });
    g
}

/// `GET /metrics`.
pub async fn json(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.metrics.json(&gauges(&state)))
}

/// `GET /metrics/prometheus`.
pub async fn prometheus(state: web::Data<AppState>) -> HttpResponse {
    let mut g = with_history(gauges(&state), &state);
    let limit = state.settings.health_timeout.min(Duration::from_secs(2));
    g.leases = match tokio::time::timeout(limit, system::live_leases(&state.pool)).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "live leases not counted for this scrape");
            None
        }
        Err(_) => None,
    };
    match state.metrics.prometheus_text(&g) {
        Ok(body) => HttpResponse::Ok()
            .insert_header((
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            ))
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body(body),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode metrics");
            HttpResponse::InternalServerError().json(json!({ "error": "cannot encode metrics" }))
        }
    }
}
