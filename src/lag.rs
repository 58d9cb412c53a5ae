//! The background lag pass (docs/operations.md, "Lag at scale"): while the subscribed (group,
//! partition) pairs are more than the views may measure on request
//! (`QUEEN_LAG_LIVE_PAIRS`), one broker at a time walks every partition in chunks and leaves
//! where each group stands in PostgreSQL (`storage::queues::lag`), at most once every
//! `QUEEN_LAG_PASS_MS`. Every broker runs this loop; the advisory lock and the age of the
//! last pass (PostgreSQL's clock) keep them from repeating each other's work.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::storage::queues::lag;

/// Partitions read by one statement of a pass.
pub const CHUNK: i64 = 20_000;

/// One look: takes a pass when the pairs are past `live_pairs` and the last pass is older
/// than `every`. Returns whether this broker took one.
async fn look(pool: &PgPool, live_pairs: i64, every: Duration) -> Result<bool, String> {
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    if lag::within(&mut conn, live_pairs)
        .await
        .map_err(|e| e.to_string())?
    {
        return Ok(false);
    }
    let age = lag::pass_age(&mut conn).await.map_err(|e| e.to_string())?;
    if age.is_some_and(|a| a < every.as_secs_f64()) {
        return Ok(false);
    }
    let began = Instant::now();
    // The pass holds a session-level advisory lock: on a connection of its own, closed after,
    // so the lock can never stay with a pooled connection whatever happens to the pass.
    let mut conn = conn.detach();
    let taken = lag::take_pass(&mut conn, CHUNK).await;
    let _ = sqlx::Connection::close(conn).await;
    match taken.map_err(|e| e.to_string())? {
        Some(info) => {
            tracing::info!(
                partitions = info.partitions,
                pairs = info.pairs,
                ms = began.elapsed().as_millis() as u64,
                "lag pass taken"
            );
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Looks every `every` (a tenth of it at most between looks, so a pass follows the pairs
/// crossing the limit soon) until the broker stops.
pub async fn pass_loop(pool: PgPool, live_pairs: i64, every: Duration) {
    let mut tick = tokio::time::interval((every / 10).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match look(&pool, live_pairs, every).await {
            Ok(_) => failing = false,
            // Said once per run of failures (PostgreSQL away fails every look).
            Err(why) if !failing => {
                failing = true;
                tracing::warn!(error = %why, "lag pass failed; the views keep the previous one");
            }
            Err(why) => tracing::debug!(error = %why, "lag pass failed again"),
        }
    }
}
