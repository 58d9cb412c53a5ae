//! Read-only views of the 2.x state for operators: `GET /api/v1/kv/namespaces`,
//! `GET /api/v1/locks`, `GET /api/v1/timers` and `GET /streams/v1/queries` (read capability;
//! the dashboard's "State" page and `queenctl kv list`, `locks`, `timers`, `streams`). Each
//! answers at most [`ROWS`] rows from one statement on the admin pool
//! (`storage::observe::features`); `truncated` says when there were more.

use actix_web::{web, HttpResponse};
use serde_json::{json, Value};

use crate::http::error::{with_db, ApiError};
use crate::protocol::time::iso_millis;
use crate::state::AppState;
use crate::storage::observe::features;

/// Most rows of one answer.
pub const ROWS: usize = 100;

/// Reads one more row than shown, to tell whether the list was cut.
async fn rows<T>(
    state: &AppState,
    read: impl AsyncFnOnce(
        &mut sqlx::PgConnection,
        i64,
    ) -> Result<Vec<T>, crate::storage::error::StorageError>,
) -> Result<(Vec<T>, bool), ApiError> {
    let mut found = with_db(state, async {
        let mut conn = state.admin_pool.acquire().await?;
        read(&mut conn, ROWS as i64 + 1).await
    })
    .await?;
    let truncated = found.len() > ROWS;
    found.truncate(ROWS);
    Ok((found, truncated))
}

/// `GET /api/v1/kv/namespaces`: live keys, bytes and expiring keys per namespace.
pub async fn namespaces(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (list, truncated) = rows(&state, async |c, n| features::namespaces(c, n).await).await?;
    let list: Vec<Value> = list
        .into_iter()
        .map(|n| {
            json!({
                "namespace": n.namespace,
                "keys": n.keys,
                "bytes": n.bytes,
                "expiring": n.expiring,
                "expiringSoon": n.expiring_soon,
                "lastWrite": n.last_write.map(iso_millis),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "namespaces": list, "truncated": truncated })))
}

/// `GET /api/v1/locks`: live permits (holder, token, expiry), the soonest to expire first.
pub async fn locks(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (list, truncated) = rows(&state, async |c, n| features::permits(c, n).await).await?;
    let list: Vec<Value> = list
        .into_iter()
        .map(|p| {
            let (name, slot) = match p.key.rsplit_once('#') {
                Some((name, slot)) => (name.to_string(), slot.parse::<u32>().ok()),
                None => (p.key.clone(), None),
            };
            // The row's value is `{"owner", "since"}`, written by the lock ops; anything else
            // is shown as unknown rather than failing the list.
            let value: Value = serde_json::from_str(&p.value).unwrap_or(Value::Null);
            json!({
                "name": name,
                "slot": slot,
                "owner": value.get("owner").cloned().unwrap_or(Value::Null),
                "since": value.get("since").cloned().unwrap_or(Value::Null),
                "token": p.token,
                "expiresAt": p.expires_at.map(iso_millis),
                "renewedAt": iso_millis(p.renewed_at),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "locks": list, "truncated": truncated })))
}

/// `GET /api/v1/timers`: pending timers per queue, next due time and lateness.
pub async fn timers(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (list, truncated) = rows(&state, async |c, n| features::timers(c, n).await).await?;
    let list: Vec<Value> = list
        .into_iter()
        .map(|t| {
            json!({
                "queue": t.queue,
                "pending": t.pending,
                "nextDue": iso_millis(t.next_due),
                "lateSeconds": t.late_seconds,
                "refused": t.refused,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "queues": list, "truncated": truncated })))
}

/// `GET /streams/v1/queries`: each stream query with its partitions' state and last cycle.
pub async fn stream_queries(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (list, truncated) = rows(&state, async |c, n| features::stream_queries(c, n).await).await?;
    let list: Vec<Value> = list
        .into_iter()
        .map(|q| {
            json!({
                "name": q.name,
                "sourceQueue": q.source_queue,
                "sinkQueue": q.sink_queue,
                "partitions": q.partitions,
                "stateKeys": q.state_keys,
                "stateBytes": q.state_bytes,
                "largestPartitionBytes": q.largest_partition_bytes,
                "cycles": q.cycles,
                "lastCycle": q.last_cycle.map(iso_millis),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "queries": list, "truncated": truncated })))
}
