//! Fast acks grouped into shared commits, the way committers group pushes.
//!
//! The common ack (every message `completed`, one lease this broker handed out, see
//! [`crate::storage::consume::acks::plan_completed_fast`]) is one conditional UPDATE of one consumer row.
//! Run alone, each is its own statement and its own durable commit (a WAL flush). Here a worker
//! (one in the broker, `ACK_WORKERS` in `app.rs`) takes every plan that is waiting when it is
//! free and applies them all in **one** statement, committed durably once: under load one
//! flush serves many consumers' acks, and a lone ack waits for nothing (a free worker takes it
//! at once).
//!
//! A plan applies only if its lease is still live with the same range and the committed offset
//! is not past the first message it acks (an ack below the cursor is the general path's
//! no-op, reference §2.5); a plan that does not apply,
//! and every plan of a group whose statement failed, answers "not applied", and the request
//! takes the general path (its own transaction, which re-reads everything and gives the
//! answer or the error). Two plans for the same consumer row never share a statement (an
//! UPDATE applies one source row per target row): the later one is answered "not applied".

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Mutex};
use uuid::Uuid;

use crate::storage::consume::acks::FastAck;
use crate::storage::consume::conns::KeptConn;
use crate::storage::consume::grouping::{next_group_keeping, one_per_row, Job, Queue, RowKey};

impl RowKey for FastAck {
    fn row(&self) -> (i64, &str) {
        (self.partition_id, &self.group)
    }
}

/// Plans applied by one statement at most.
const MAX_GROUP: usize = 256;

/// What an applied plan did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The lease ended with it.
    pub released: bool,
    /// It ended the lease with messages left behind in the partition (the row now asks for
    /// attention): a waiting consumer may take them at once.
    pub left_behind: bool,
}

/// The grouped statement. The plans arrive sorted by (partition, group), so the rows are
/// locked in the order every ack transaction uses.
const GROUP_SQL: &str = "
WITH a AS (
    SELECT *
      FROM unnest($1::int8[], $2::text[], $3::uuid[], $4::int8[], $5::int8[], $6::int8[],
                  $7::int8[])
           WITH ORDINALITY AS a(pid, grp, lease, from_, end_, to_, lowest, n)
)
UPDATE queen.partition_consumers c
   SET committed_offset = a.end_,
       lease_expires_at = CASE WHEN a.end_ >= a.to_ THEN NULL ELSE c.lease_expires_at END,
       attention_at = CASE
           WHEN a.end_ < a.to_ THEN c.attention_at
           WHEN a.end_ < (SELECT p.next_offset FROM queen.partitions p WHERE p.id = a.pid)
               THEN now()
           ELSE NULL
       END,
       batch_retry_count = CASE WHEN a.end_ >= a.to_ THEN 0 ELSE c.batch_retry_count END,
       retry_lease_id = CASE WHEN a.end_ >= a.to_ THEN NULL ELSE c.retry_lease_id END,
       last_consumed_at = now(),
       total_consumed = c.total_consumed + (a.end_ - c.committed_offset)
  FROM a
 WHERE c.partition_id = a.pid
   AND c.consumer_group = a.grp
   AND c.lease_id = a.lease
   AND c.lease_expires_at > now()
   AND c.leased_from = a.from_
   AND c.leased_to = a.to_
   AND c.committed_offset <= a.lowest
RETURNING a.n, a.end_ >= a.to_, a.end_ >= a.to_ AND c.attention_at IS NOT NULL";

/// The handle the ack routes use; cheap to clone.
#[derive(Clone)]
pub struct AckGroup {
    /// A request gets back `Some` when its plan was applied, `None` when it must take the
    /// general path.
    jobs: mpsc::UnboundedSender<Job<FastAck, Option<Applied>>>,
    pool: PgPool,
}

impl AckGroup {
    /// Starts `workers` workers applying plans on `pool` (on the current runtime). A group
    /// statement unanswered within `answer_within` is given up and its connection dropped (a
    /// half-open connection never answers, and would hold the worker for good).
    pub fn start(pool: PgPool, workers: usize, answer_within: Duration) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..workers.max(1) {
            actix_web::rt::spawn(work(pool.clone(), queue.clone(), answer_within));
        }
        Self { jobs, pool }
    }

    /// The workers' pool (for the pool gauges).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies `ack` together with whatever other plans are waiting: `Some` when it was
    /// applied, `None` when the request must take the general path.
    pub async fn apply(&self, ack: FastAck) -> Option<Applied> {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send((ack, reply)).is_err() {
            return None;
        }
        answer.await.unwrap_or(None)
    }
}

/// One worker: takes the first waiting plan and every other one waiting with it, applies them.
async fn work(pool: PgPool, queue: Queue<FastAck, Option<Applied>>, answer_within: Duration) {
    let mut conn = KeptConn::new(pool);
    while let Some(group) = next_group_keeping(&queue, MAX_GROUP, &mut conn).await {
        apply_group(&mut conn, group, answer_within).await;
    }
}

/// Applies one group and answers every plan in it. A second plan for a row already in the group
/// takes the general path, which decides it.
async fn apply_group(
    conn: &mut KeptConn,
    group: Vec<Job<FastAck, Option<Applied>>>,
    answer_within: Duration,
) {
    let (plans, waiting) = one_per_row(group, || None);
    // Unanswered in time: the connection is taken for dead; the general path decides each ack
    // (one this statement applied after all is then found applied).
    let ran = tokio::time::timeout(answer_within, run(conn, &plans))
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
    let applied = match ran {
        Ok(applied) => applied,
        Err(e) => {
            conn.discard();
            tracing::warn!(error = %e, acks = plans.len(),
                "grouped ack statement failed; its acks take the general path");
            vec![None; plans.len()]
        }
    };
    for (reply, applied) in waiting.into_iter().zip(applied) {
        let _ = reply.send(applied);
    }
}

/// Runs [`GROUP_SQL`] for `plans`: per plan, in order, whether it was applied and if so what
/// it did.
async fn run(conn: &mut KeptConn, plans: &[FastAck]) -> Result<Vec<Option<Applied>>, sqlx::Error> {
    let pids: Vec<i64> = plans.iter().map(|p| p.partition_id).collect();
    let groups: Vec<&str> = plans.iter().map(|p| p.group.as_str()).collect();
    let leases: Vec<Uuid> = plans.iter().map(|p| p.lease).collect();
    let froms: Vec<i64> = plans.iter().map(|p| p.from).collect();
    let ends: Vec<i64> = plans.iter().map(|p| p.end).collect();
    let tos: Vec<i64> = plans.iter().map(|p| p.to).collect();
    let lowest: Vec<i64> = plans.iter().map(|p| p.lowest).collect();
    let rows: Vec<(i64, bool, bool)> = sqlx::query_as(GROUP_SQL)
        .bind(&pids)
        .bind(&groups)
        .bind(&leases)
        .bind(&froms)
        .bind(&ends)
        .bind(&tos)
        .bind(&lowest)
        .fetch_all(conn.get().await?)
        .await?;
    let mut applied = vec![None; plans.len()];
    for (n, released, left_behind) in rows {
        // `n` is the plan's 1-based position in the arrays.
        if let Some(slot) = usize::try_from(n - 1).ok().and_then(|i| applied.get_mut(i)) {
            *slot = Some(Applied {
                released,
                left_behind,
            });
        }
    }
    Ok(applied)
}
