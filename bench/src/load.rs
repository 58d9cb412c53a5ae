//! The three workloads, each from N concurrent connections for a fixed time:
//!
//! - [`push_workers`]: `POST /api/v1/push` to the broker, `batch` items per request, every
//!   request to one partition drawn at random among `partitions`.
//! - [`segment_workers`], baselines (1) and (1+): the broker's rows written directly by SQL,
//!   one segment of `batch` messages (plus its `batch` dedup-sidecar rows when dedup is on) per
//!   transaction. [`Shape::Rows`] is just the inserts, one statement per transaction;
//!   [`Shape::Transaction`] is the broker's commit transaction for one segment (lock the
//!   partition row, probe the sidecar, then one statement that moves `next_offset` and inserts
//!   the segment and the sidecar rows, commit).
//! - [`naive_workers`], baseline (2): one row per message, `batch` rows per transaction.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_broker::storage::{push::dedup, segments::frames};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::data::{self, Rng};
use crate::http::HttpConn;
use crate::measure::{Window, WorkerStats};
use crate::BoxError;

/// Counts `"status":"queued"` in a push response.
fn count_queued(body: &[u8]) -> u64 {
    const NEEDLE: &[u8] = b"\"status\":\"queued\"";
    body.windows(NEEDLE.len()).filter(|w| *w == NEEDLE).count() as u64
}

fn short(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.chars().take(200).collect()
}

/// Starts `connections` push workers against the broker on `port`.
pub fn push_workers(
    port: u16,
    connections: usize,
    batch: usize,
    partitions: u64,
    window: Window,
    tag: u64,
) -> Vec<JoinHandle<WorkerStats>> {
    let names: Arc<Vec<String>> = Arc::new((0..partitions).map(data::partition_name).collect());
    (0..connections)
        .map(|c| {
            let names = names.clone();
            tokio::spawn(async move {
                let mut stats = WorkerStats::default();
                let mut conn = HttpConn::new(port);
                let mut rng = Rng::new(tag ^ ((c as u64) << 32));
                let mut body = String::with_capacity(batch * 420 + 16);
                let mut seq = 0u64;
                while Instant::now() < window.end {
                    let partition = &names[rng.below(names.len() as u64) as usize];
                    data::push_body(&mut body, partition, batch, (tag, c), &mut seq, &mut rng);
                    let started = Instant::now();
                    match conn.request("POST", "/api/v1/push", body.as_bytes()).await {
                        Ok(r) if r.status == 201 => {
                            let queued = count_queued(&r.body);
                            stats.not_queued += batch as u64 - queued.min(batch as u64);
                            stats.record(&window, started, queued);
                        }
                        Ok(r) => {
                            stats.error(format!("HTTP {}: {}", r.status, short(&r.body)));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(e) => {
                            stats.error(format!("push: {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                stats
            })
        })
        .collect()
}

/// Pushes one message to every partition (100 partitions per request), so every partition
/// actor exists and knows its partition id before the timed run; returns messages stored.
///
/// # Errors
///
/// When a priming request is not fully `queued`.
pub async fn prime(port: u16, partitions: u64, connections: usize) -> Result<u64, BoxError> {
    let chunks: Arc<Vec<Vec<u64>>> = Arc::new(
        (0..partitions)
            .collect::<Vec<_>>()
            .chunks(100)
            .map(<[u64]>::to_vec)
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let tag = data::fresh_seed();
    let workers: Vec<JoinHandle<Result<u64, String>>> = (0..connections.min(chunks.len()))
        .map(|c| {
            let (chunks, next) = (chunks.clone(), next.clone());
            tokio::spawn(async move {
                let mut conn = HttpConn::new(port);
                let mut rng = Rng::new(tag ^ c as u64);
                let mut stored = 0;
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let Some(chunk) = chunks.get(n) else {
                        return Ok(stored);
                    };
                    let mut body = String::from("{\"items\":[");
                    for (k, p) in chunk.iter().enumerate() {
                        if k > 0 {
                            body.push(',');
                        }
                        let txn = data::transaction_id(tag, c, *p);
                        data::push_item_json(&mut body, &data::partition_name(*p), &txn, &mut rng);
                    }
                    body.push_str("]}");
                    let r = conn
                        .request("POST", "/api/v1/push", body.as_bytes())
                        .await
                        .map_err(|e| format!("priming push: {e}"))?;
                    let queued = count_queued(&r.body);
                    if r.status != 201 || queued != chunk.len() as u64 {
                        return Err(format!(
                            "priming push answered {}: {}",
                            r.status,
                            short(&r.body)
                        ));
                    }
                    stored += queued;
                }
            })
        })
        .collect();
    let mut total = 0;
    for w in workers {
        total += w.await??;
    }
    Ok(total)
}

/// Opens `n` connections to `url`.
///
/// # Errors
///
/// Any connection error.
pub async fn connect_all(url: &str, n: usize) -> Result<Vec<PgConnection>, BoxError> {
    let attempts = (0..n).map(|_| PgConnection::connect(url));
    let conns = futures_util::future::join_all(attempts).await;
    Ok(conns.into_iter().collect::<Result<Vec<_>, _>>()?)
}

/// How baseline (1) writes a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// (1): the segment row and its sidecar rows, one INSERT statement per transaction; base
    /// offsets come from a range of the connection's own, so no row is locked or updated.
    Rows,
    /// (1+): the broker's commit transaction for one segment.
    Transaction,
}

/// Baselines (1) and (1+): one segment of `batch` messages per transaction on a random
/// partition among `partition_ids` (see the module docs).
pub fn segment_workers(
    conns: Vec<PgConnection>,
    partition_ids: Arc<Vec<i64>>,
    batch: usize,
    dedup_on: bool,
    shape: Shape,
    window: Window,
    tag: u64,
) -> Vec<JoinHandle<WorkerStats>> {
    conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            let ids = partition_ids.clone();
            tokio::spawn(async move {
                let mut stats = WorkerStats::default();
                let mut rng = Rng::new(tag ^ ((c as u64) << 32));
                let mut seq = 0u64;
                while Instant::now() < window.end {
                    let pid = ids[rng.below(ids.len() as u64) as usize];
                    let items: Vec<broker_actors::Item> = (0..batch)
                        .map(|_| {
                            seq += 1;
                            data::broker_item(data::transaction_id(tag, c, seq), &mut rng)
                        })
                        .collect();
                    let started = Instant::now();
                    let done = match shape {
                        Shape::Rows => {
                            // Offsets far apart per connection: unique without coordination.
                            let base = ((c as i64) << 40) + seq as i64;
                            insert_segment(&mut conn, pid, base, &items, dedup_on).await
                        }
                        Shape::Transaction => write_segment(&mut conn, pid, &items, dedup_on).await,
                    };
                    match done {
                        Ok(()) => stats.record(&window, started, batch as u64),
                        Err(e) => {
                            stats.error(format!("segment transaction: {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                let _ = conn.close().await;
                stats
            })
        })
        .collect()
}

/// A fixed dedup secret: the baselines hash as the broker does (keyed SipHash), and their
/// sidecar rows are never probed by a broker.
fn bench_secret() -> dedup::Secret {
    dedup::Secret::from_stored(&[7; 16]).expect("16 bytes")
}

/// One baseline (1) transaction: the segment row and its sidecar rows in one statement.
async fn insert_segment(
    conn: &mut PgConnection,
    pid: i64,
    base: i64,
    items: &[broker_actors::Item],
    dedup_on: bool,
) -> sqlx::Result<()> {
    let bytes = frames::encode(items.iter());
    let n = if dedup_on { items.len() } else { 0 };
    let hashes: Vec<i64> = items[..n]
        .iter()
        .map(|i| dedup::key_hash(&bench_secret(), &i.transaction_id))
        .collect();
    let offsets: Vec<i64> = (0..n as i64).map(|k| base + k).collect();
    sqlx::query(
        "WITH segments AS (
             INSERT INTO queen.segments (partition_id, base_offset, msg_count, frames)
             VALUES ($1, $2, $3, $4)
         )
         INSERT INTO queen.dedup_keys (partition_id, key_hash, msg_offset)
         SELECT $1, * FROM unnest($5::int8[], $6::int8[])",
    )
    .bind(pid)
    .bind(base)
    .bind(items.len() as i32)
    .bind(bytes)
    .bind(&hashes)
    .bind(&offsets)
    .execute(conn)
    .await?;
    Ok(())
}

/// One baseline (1+) transaction; the statements are the broker's (src/storage/push/commit.rs and
/// src/storage/push/dedup.rs) for a batch of one segment.
async fn write_segment(
    conn: &mut PgConnection,
    pid: i64,
    items: &[broker_actors::Item],
    dedup_on: bool,
) -> sqlx::Result<()> {
    let bytes = frames::encode(items.iter());
    let mut tx = conn.begin().await?;
    let (_, next_offset, window_secs): (i64, i64, i32) = sqlx::query_as(
        "SELECT p.id, p.next_offset, q.dedup_window_seconds
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.id = ANY($1)
          ORDER BY p.id
            FOR UPDATE OF p",
    )
    .bind([pid].as_slice())
    .fetch_one(&mut *tx)
    .await?;
    let (mut key_pids, mut key_hashes, mut key_offsets) = (Vec::new(), Vec::new(), Vec::new());
    if dedup_on {
        let hashes: Vec<i64> = items
            .iter()
            .map(|i| dedup::key_hash(&bench_secret(), &i.transaction_id))
            .collect();
        let pids = vec![pid; items.len()];
        let windows = vec![window_secs; items.len()];
        let hits: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT d.partition_id, d.key_hash, d.msg_offset
               FROM unnest($1::int8[], $2::int8[], $3::int4[]) AS x(partition_id, key_hash, window_secs)
               JOIN queen.dedup_keys d
                 ON d.partition_id = x.partition_id
                AND d.key_hash = x.key_hash
              WHERE d.created_at > now() - make_interval(secs => x.window_secs)",
        )
        .bind(&pids)
        .bind(&hashes)
        .bind(&windows)
        .fetch_all(&mut *tx)
        .await?;
        if !hits.is_empty() {
            return Err(sqlx::Error::Protocol(
                "baseline keys are unique; the probe found one".into(),
            ));
        }
        key_offsets = (0..items.len() as i64).map(|n| next_offset + n).collect();
        key_pids = pids;
        key_hashes = hashes;
    }
    sqlx::query(
        "WITH moved AS (
             UPDATE queen.partitions p
                SET next_offset = x.next_offset,
                    last_write_at = now()
               FROM unnest($1::int8[], $2::int8[]) AS x(id, next_offset)
              WHERE p.id = x.id
         ), segments AS (
             INSERT INTO queen.segments (partition_id, base_offset, msg_count, frames)
             SELECT * FROM unnest($3::int8[], $4::int8[], $5::int4[], $6::bytea[])
         )
         INSERT INTO queen.dedup_keys (partition_id, key_hash, msg_offset)
         SELECT * FROM unnest($7::int8[], $8::int8[], $9::int8[])",
    )
    .bind([pid].as_slice())
    .bind([next_offset + items.len() as i64].as_slice())
    .bind([pid].as_slice())
    .bind([next_offset].as_slice())
    .bind([items.len() as i32].as_slice())
    .bind([bytes].as_slice())
    .bind(&key_pids)
    .bind(&key_hashes)
    .bind(&key_offsets)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The naive table: one row per message, payload as text (the cheaper choice for this layout;
/// jsonb would cost parsing). With `unique`, the dedup index on (partition, transaction id).
///
/// # Errors
///
/// Any database error.
pub async fn create_naive_table(conn: &mut PgConnection, unique: bool) -> Result<(), BoxError> {
    sqlx::query(
        "CREATE TABLE bench_messages (
             id             UUID PRIMARY KEY,
             partition_id   BIGINT NOT NULL,
             transaction_id TEXT NOT NULL,
             payload        TEXT NOT NULL,
             created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )
    .execute(&mut *conn)
    .await?;
    if unique {
        sqlx::query(
            "CREATE UNIQUE INDEX bench_messages_dedup ON bench_messages (partition_id, transaction_id)",
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Baseline (2): `batch` rows per transaction (one multi-row INSERT), one partition per
/// transaction drawn at random, ids minted as UUIDv7 like the broker's.
pub fn naive_workers(
    conns: Vec<PgConnection>,
    partitions: u64,
    batch: usize,
    unique: bool,
    window: Window,
    tag: u64,
) -> Vec<JoinHandle<WorkerStats>> {
    let sql = if unique {
        "INSERT INTO bench_messages (id, partition_id, transaction_id, payload)
         SELECT * FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[])
         ON CONFLICT (partition_id, transaction_id) DO NOTHING"
    } else {
        "INSERT INTO bench_messages (id, partition_id, transaction_id, payload)
         SELECT * FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[])"
    };
    conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            tokio::spawn(async move {
                let mut stats = WorkerStats::default();
                let mut rng = Rng::new(tag ^ ((c as u64) << 32));
                let mut seq = 0u64;
                while Instant::now() < window.end {
                    let pid = rng.below(partitions) as i64 + 1;
                    let ids: Vec<uuid::Uuid> = (0..batch).map(|_| uuid::Uuid::now_v7()).collect();
                    let pids = vec![pid; batch];
                    let txns: Vec<String> = (0..batch)
                        .map(|_| {
                            seq += 1;
                            data::transaction_id(tag, c, seq)
                        })
                        .collect();
                    let payloads: Vec<String> =
                        (0..batch).map(|_| data::payload(&mut rng)).collect();
                    let started = Instant::now();
                    let done = sqlx::query(sql)
                        .bind(&ids)
                        .bind(&pids)
                        .bind(&txns)
                        .bind(&payloads)
                        .execute(&mut conn)
                        .await;
                    match done {
                        Ok(r) if r.rows_affected() == batch as u64 => {
                            stats.record(&window, started, batch as u64)
                        }
                        Ok(r) => stats.error(format!(
                            "naive insert stored {} of {batch} rows",
                            r.rows_affected()
                        )),
                        Err(e) => {
                            stats.error(format!("naive insert: {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                let _ = conn.close().await;
                stats
            })
        })
        .collect()
}
