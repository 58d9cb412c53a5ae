//! Hand-off claims of concurrent pops grouped into shared statements, the way
//! [`crate::storage::consume::ack_group`] groups acks.
//!
//! A hand-off claim ([`crate::storage::consume::statements::HANDOFF_SQL`]) names the partition it takes,
//! so under load most pops are one such claim each: a statement whose executor start-up, plan
//! lookup, protocol round trip and commit cost more than the row it updates. Here a worker
//! (`CLAIM_WORKERS` in `app.rs`) takes every claim that is waiting when it is free and runs
//! them all as **one** statement (`GROUP_SQL`): under load one start-up and one commit serve
//! several pops, and a lone claim waits for nothing (a free worker takes it at once).
//!
//! Each claim in the group is decided exactly as the single statement decides it: the
//! (partition, group) row is locked unless another claim is locking it right now (`SKIP
//! LOCKED`), and taken only if its lease is free or ran out, messages wait past the committed
//! offset, and the queue is one the one-statement pop serves. A claim that is not taken gets
//! no rows, as the single statement's would. Two claims of the same row never share a
//! statement: the later one is answered "nothing claimed" (a hand-off is only a hint). When the
//! group's statement fails, every claim in it is answered "run it yourself", and the pop runs
//! the single statement on its own connection, which gives the error or the rows.
//!
//! The workers have a pool of their own (one connection per worker, which it keeps between
//! statements, and one for releasing leases claimed ahead; asynchronous commit like every
//! lease): a pop that already ran a statement holds a connection of the lease pool while it
//! waits for its claim, so a worker taking from that pool could wait for the very connections
//! its claims hold.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Mutex};
use uuid::Uuid;

use crate::storage::consume::conns::KeptConn;
use crate::storage::consume::grouping::{next_group_keeping, one_per_row, Job, Queue, RowKey};
use crate::storage::consume::statements::{
    claimed_deleted, claimed_segments, ReadyRow, RELEASE_SQL,
};

impl RowKey for ClaimJob {
    fn row(&self) -> (i64, &str) {
        (self.partition_id, &self.group)
    }
}

/// Claims run by one statement at most.
const MAX_GROUP: usize = 64;

/// One hand-off claim: take partition `partition_id` of `queue` for `group` under `lease`,
/// up to `want` messages, without the frames of the segments with bases in `held` (a run of
/// consecutive segments the broker holds).
#[derive(Debug, Clone)]
pub struct ClaimJob {
    /// Queue name.
    pub queue: String,
    /// Consumer group.
    pub group: String,
    /// The lease the pop hands out.
    pub lease: Uuid,
    /// Most messages leased.
    pub want: i64,
    /// The partition's database id.
    pub partition_id: i64,
    /// First and last base of the segments of the partition the broker holds.
    pub held: Option<(i64, i64)>,
}

/// What a waiting pop gets back: the claim's rows (none: nothing claimed), or `None` when the
/// group's statement failed and the pop must run its claim itself.
type Reply = Option<Vec<ReadyRow>>;

/// The grouped hand-off claim: [`crate::storage::consume::statements::HANDOFF_SQL`] for every claim of the
/// arrays `$1`..`$7` at once (queue, group, lease, most messages, partition, first and last
/// held base), lease owner `$8`. Its rows are those of the single statement, each with `n`, the
/// 1-based position of its claim, ordered by claim then segment.
const GROUP_SQL: &str = concat!(
    "
WITH j AS (
    SELECT *
      FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int8[], $5::int8[], $6::int8[],
                  $7::int8[])
           WITH ORDINALITY AS j(queue, grp, lease, want, pid, held_from, held_to, n)
), target AS (
    SELECT c.partition_id, c.consumer_group, j.n, j.lease, j.want, q.id AS queue_id,
           q.lease_time
      FROM j
      JOIN queen.queues q
        ON q.name = j.queue AND q.window_buffer = 0 AND q.delayed_processing = 0
      JOIN queen.consumer_subscriptions s
        ON s.queue_id = q.id AND s.consumer_group = j.grp AND NOT s.conflation
      JOIN queen.partition_consumers c
        ON c.partition_id = j.pid AND c.consumer_group = j.grp AND c.queue_id = q.id
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < p.next_offset
       FOR UPDATE OF c SKIP LOCKED
), claim AS (
    UPDATE queen.partition_consumers c
       SET lease_id = t.lease,
           lease_owner = $8,
           lease_acquired_at = now(),
           lease_expires_at = now() + (CASE WHEN t.lease_time > 0 THEN t.lease_time
                                            ELSE 60 END) * interval '1 second',
           attention_at = NULL,
           leased_from = c.committed_offset,
           leased_to = GREATEST(c.committed_offset,
                                LEAST(c.committed_offset + t.want, p.next_offset))
      FROM target t, queen.partitions p
     WHERE c.partition_id = t.partition_id
       AND c.consumer_group = t.consumer_group
       AND p.id = t.partition_id
 RETURNING t.n, t.queue_id, t.lease_time, c.partition_id, p.uuid, p.name,
           c.committed_offset, c.batch_retry_count, p.next_offset, c.leased_to
)
SELECT claim.n, claim.queue_id, claim.lease_time,
       claim.partition_id, claim.uuid, claim.name, claim.committed_offset,
       claim.batch_retry_count, claim.next_offset,
",
    claimed_deleted!(),
    "
       s.base_offset, s.msg_count,
       CASE WHEN s.base_offset BETWEEN j.held_from AND j.held_to
            THEN NULL ELSE s.frames END AS frames
  FROM claim
  JOIN j ON j.n = claim.n",
    claimed_segments!(),
    "
 ORDER BY claim.n, s.base_offset"
);

/// One row of [`GROUP_SQL`]: a row of the single statement and the position of its claim.
#[derive(sqlx::FromRow)]
struct GroupRow {
    n: i64,
    #[sqlx(flatten)]
    row: ReadyRow,
}

/// The handle the pops use; cheap to clone.
#[derive(Clone, Debug)]
pub struct ClaimGroup {
    jobs: mpsc::UnboundedSender<Job<ClaimJob, Reply>>,
    pool: PgPool,
    answer_within: Duration,
}

impl ClaimGroup {
    /// Starts `workers` workers running claims on `pool` (on the current runtime) as lease
    /// owner `owner`. `pool` must not be the one pops hold connections of while they wait. A
    /// group statement unanswered within `answer_within` is given up and its connection
    /// dropped (a half-open connection never answers, and would hold the worker for good).
    pub fn start(pool: PgPool, owner: String, workers: usize, answer_within: Duration) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        let queue = Arc::new(Mutex::new(queue));
        let owner: Arc<str> = Arc::from(owner);
        for _ in 0..workers.max(1) {
            actix_web::rt::spawn(work(
                pool.clone(),
                owner.clone(),
                queue.clone(),
                answer_within,
            ));
        }
        Self {
            jobs,
            pool,
            answer_within,
        }
    }

    /// Releases `leases` (claimed through this group, or ahead of a pop) by id, retrying while
    /// PostgreSQL is unreachable, for two minutes at most; whether they were released.
    pub(crate) async fn release(&self, leases: &[Uuid]) -> bool {
        release_retrying(&self.pool, leases, self.answer_within).await
    }

    /// Watches `lease` while a pop's own statements claim under it (`armed`: the pop holds
    /// leases, i.e. it does not commit at delivery); see [`LostClaim`].
    pub(crate) fn guard(&self, lease: Uuid, armed: bool) -> LostClaim<'_> {
        LostClaim {
            claims: self,
            lease,
            armed,
        }
    }

    /// Releases `lease`, claimed by a pop's own statements whose outcome is unknown (the
    /// connection broke with a statement sent, a statement failed after an earlier one had
    /// claimed, or the pop was given up mid-statement): it was delivered to nobody, yet it
    /// would hold its partitions for the queue's whole lease time. Released in the background
    /// on this group's pool, as a grouped claim's unanswered leases are.
    pub fn release_lost(&self, lease: Uuid) {
        // (Spawned: a pop given up by its time limit releases from its drop.)
        actix_web::rt::spawn(release_unanswered(
            self.pool.clone(),
            vec![lease],
            self.answer_within,
        ));
    }

    /// The workers' pool (for the pool gauges).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs `job` together with whatever other claims are waiting: its rows (none when nothing
    /// was claimed), or `None` when the caller must run the claim itself.
    pub async fn claim(&self, job: ClaimJob) -> Option<Vec<ReadyRow>> {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send((job, reply)).is_err() {
            return None;
        }
        answer.await.unwrap_or(None)
    }
}

/// A pop's lease while its own statements run ([`ClaimGroup::guard`]): released
/// ([`ClaimGroup::release_lost`]) if the pop ends, still armed, without an answer: an error,
/// or dropped by its time limit mid-statement.
pub(crate) struct LostClaim<'a> {
    claims: &'a ClaimGroup,
    lease: Uuid,
    armed: bool,
}

impl LostClaim<'_> {
    /// The pop has its answer: nothing to release.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for LostClaim<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::warn!(lease = %self.lease,
                "a pop ended without an answer after its statements ran; what it claimed is released");
            self.claims.release_lost(self.lease);
        }
    }
}

/// One worker: takes the first waiting claim and every other one waiting with it, runs them.
async fn work(
    pool: PgPool,
    owner: Arc<str>,
    queue: Queue<ClaimJob, Reply>,
    answer_within: Duration,
) {
    let mut conn = KeptConn::new(pool.clone());
    while let Some(group) = next_group_keeping(&queue, MAX_GROUP, &mut conn).await {
        run_group(&mut conn, &pool, &owner, group, answer_within).await;
    }
}

/// Runs one group and answers every claim in it. A second claim of a row already in the group
/// claims nothing.
async fn run_group(
    conn: &mut KeptConn,
    pool: &PgPool,
    owner: &str,
    group: Vec<Job<ClaimJob, Reply>>,
    answer_within: Duration,
) {
    let (jobs, waiting) = one_per_row(group, || Some(Vec::new()));
    let Ok(ran) = tokio::time::timeout(answer_within, run(conn, owner, &jobs)).await else {
        // Unanswered in time (a half-open connection): the connection is taken for dead. The
        // statement may still have claimed: such a lease was delivered to nobody, yet it would
        // hold its partition for the queue's whole lease time (a backlog no pop drains), so
        // it is released by id on another connection; meanwhile these pops claim nothing
        // (running the claim again under the same lease id could race that release).
        conn.discard();
        let leases: Vec<Uuid> = jobs.iter().map(|j| j.lease).collect();
        tracing::warn!(
            claims = jobs.len(),
            within_ms = answer_within.as_millis(),
            "grouped hand-off claim unanswered; connection dropped, its leases released"
        );
        actix_web::rt::spawn(release_unanswered(pool.clone(), leases, answer_within));
        for reply in waiting {
            let _ = reply.send(Some(Vec::new()));
        }
        return;
    };
    match ran {
        Ok(rows) => {
            for (reply, rows) in waiting.into_iter().zip(rows) {
                let _ = reply.send(Some(rows));
            }
        }
        // The link broke with the statement sent: whether it claimed is unknown, so its
        // leases are released as an unanswered claim's are (the partition fault showed such a
        // lease holding its partition for the whole lease time).
        Err(e @ (sqlx::Error::Io(_) | sqlx::Error::Protocol(_))) => {
            conn.discard();
            let leases: Vec<Uuid> = jobs.iter().map(|j| j.lease).collect();
            tracing::warn!(error = %e, claims = jobs.len(),
                "grouped hand-off claim lost its connection; its leases released");
            actix_web::rt::spawn(release_unanswered(pool.clone(), leases, answer_within));
            for reply in waiting {
                let _ = reply.send(Some(Vec::new()));
            }
        }
        Err(e) => {
            conn.discard();
            tracing::warn!(error = %e, claims = jobs.len(),
                "grouped hand-off claim failed; each pop runs its claim itself");
            for reply in waiting {
                let _ = reply.send(None);
            }
        }
    }
}

/// Releases `leases`, claimed by a statement whose answer never came, in the background (see
/// [`release_retrying`]).
async fn release_unanswered(pool: PgPool, leases: Vec<Uuid>, answer_within: Duration) {
    if !release_retrying(&pool, &leases, answer_within).await {
        tracing::warn!(
            leases = leases.len(),
            "leases of an unanswered claim not released; they run out at their expiry"
        );
    }
}

/// Releases `leases` by id, retrying (each attempt bounded by `answer_within`) while
/// PostgreSQL is unreachable, for two minutes at most; whether they were released. A lease
/// left behind would hold its partition for the queue's whole lease time (300 s by default).
async fn release_retrying(pool: &PgPool, leases: &[Uuid], answer_within: Duration) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < deadline {
        let release = sqlx::query(RELEASE_SQL).bind(leases).execute(pool);
        if let Ok(Ok(done)) = tokio::time::timeout(answer_within, release).await {
            tracing::debug!(released = done.rows_affected(), "leases released by id");
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Runs [`GROUP_SQL`] for `jobs`: per claim, in order, its rows.
async fn run(
    conn: &mut KeptConn,
    owner: &str,
    jobs: &[ClaimJob],
) -> Result<Vec<Vec<ReadyRow>>, sqlx::Error> {
    let queues: Vec<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    let groups: Vec<&str> = jobs.iter().map(|j| j.group.as_str()).collect();
    let leases: Vec<Uuid> = jobs.iter().map(|j| j.lease).collect();
    let wants: Vec<i64> = jobs.iter().map(|j| j.want).collect();
    let pids: Vec<i64> = jobs.iter().map(|j| j.partition_id).collect();
    let held_from: Vec<Option<i64>> = jobs.iter().map(|j| j.held.map(|h| h.0)).collect();
    let held_to: Vec<Option<i64>> = jobs.iter().map(|j| j.held.map(|h| h.1)).collect();
    let rows: Vec<GroupRow> = sqlx::query_as(GROUP_SQL)
        .bind(&queues)
        .bind(&groups)
        .bind(&leases)
        .bind(&wants)
        .bind(&pids)
        .bind(&held_from)
        .bind(&held_to)
        .bind(owner)
        .fetch_all(conn.get().await?)
        .await?;
    let mut out: Vec<Vec<ReadyRow>> = jobs.iter().map(|_| Vec::new()).collect();
    for r in rows {
        // `n` is the claim's 1-based position in the arrays.
        if let Some(slot) = usize::try_from(r.n - 1).ok().and_then(|i| out.get_mut(i)) {
            slot.push(r.row);
        }
    }
    Ok(out)
}
