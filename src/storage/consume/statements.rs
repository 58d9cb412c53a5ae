//! The pop's SQL: the write-order scan and the claim of the full pop, the one-statement pop
//! and the hand-off claim with the rows they return, and the fragments other claimers share
//! (`claimed_deleted!`, `claimed_segments!`, used by the grouped claims and the claims ahead).

use uuid::Uuid;

/// The columns of [`Candidate`], joined for the group in `$2`; callers add WHERE/ORDER.
pub(crate) const CANDIDATE_COLUMNS: &str =
    "SELECT p.id, p.uuid, p.name, p.next_offset, p.last_write_at, p.last_write_xid,
        c.committed, c.leased, c.leased_to,
        now() AS db_now
   FROM queen.partitions p
   LEFT JOIN LATERAL (SELECT c.committed_offset AS committed,
                             c.lease_expires_at > now() AS leased,
                             c.leased_to
                        FROM queen.partition_consumers c
                       WHERE c.partition_id = p.id AND c.consumer_group = $2
                       LIMIT 1) c ON true";

/// The write-order scan of the queue-level pop: partitions of queue `$1` written at or after
/// the watermark `($3, $4)`, oldest write first, with the group `$2`'s state, at most `$5`.
/// Served by the index `partitions_write_order`; public so tests can EXPLAIN it.
pub const SCAN_SQL: &str =
    "SELECT p.id, p.uuid, p.name, p.next_offset, p.last_write_at, p.last_write_xid,
        c.committed, c.leased, c.leased_to,
        now() AS db_now,
        (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8) AS xmin
   FROM queen.partitions p
   LEFT JOIN LATERAL (SELECT c.committed_offset AS committed,
                             c.lease_expires_at > now() AS leased,
                             c.leased_to
                        FROM queen.partition_consumers c
                       WHERE c.partition_id = p.id AND c.consumer_group = $2
                       LIMIT 1) c ON true
  WHERE p.queue_id = $1
    AND (p.last_write_xid, p.id) >= ($3, $4)
  ORDER BY p.last_write_xid, p.id
  LIMIT $5";

/// The claim of one partition for a group, in one statement: lock the (partition, group) row
/// unless another claim is locking it right now (`SKIP LOCKED`: move on rather than wait),
/// take the lease if it is free or ran out and there is something past the committed offset
/// (the scan's view may be stale: a claim of a caught-up partition would only be released
/// again), record the range `committed .. committed + $6`
/// (capped at the partition's end) as leased, and return the segments covering that range —
/// without their frames for the bases in `$7`, which the broker already holds. No row: not
/// claimed. One row per covering segment (one row with NULL segment columns when none).
pub(crate) const CLAIM_SQL: &str = "
WITH target AS (
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
     WHERE c.partition_id = $1
       AND c.consumer_group = $2
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < (SELECT next_offset FROM queen.partitions WHERE id = $1)
       FOR UPDATE OF c SKIP LOCKED
), claim AS (
    UPDATE queen.partition_consumers c
       SET lease_id = $3,
           lease_owner = $4,
           lease_acquired_at = now(),
           lease_expires_at = now() + $5 * interval '1 second',
           attention_at = NULL,
           leased_from = c.committed_offset,
           leased_to = GREATEST(c.committed_offset,
                                LEAST(c.committed_offset + $6, p.next_offset))
      FROM target t, queen.partitions p
     WHERE c.partition_id = t.partition_id
       AND c.consumer_group = t.consumer_group
       AND p.id = $1
 RETURNING c.committed_offset, c.batch_retry_count, p.next_offset, c.leased_to
)
SELECT claim.committed_offset, claim.batch_retry_count, claim.next_offset,
       (SELECT array_agg(d.msg_offset ORDER BY d.msg_offset)
          FROM queen.deleted_messages d
         WHERE d.partition_id = $1
           AND d.msg_offset >= claim.committed_offset
           AND d.msg_offset < claim.leased_to) AS deleted,
       s.base_offset, s.msg_count,
       CASE WHEN s.base_offset = ANY($7) THEN NULL ELSE s.frames END AS frames
  FROM claim
  LEFT JOIN LATERAL (
        SELECT sg.base_offset, sg.msg_count, sg.frames
          FROM queen.segments sg
         WHERE sg.partition_id = $1
           AND sg.base_offset < claim.leased_to
           AND sg.base_offset >= COALESCE((SELECT max(x.base_offset)
                                             FROM queen.segments x
                                            WHERE x.partition_id = $1
                                              AND x.base_offset <= claim.committed_offset),
                                          claim.committed_offset)
         ORDER BY sg.base_offset
       ) s ON true
 ORDER BY s.base_offset";

/// One row of [`CLAIM_SQL`].
#[derive(sqlx::FromRow)]
pub(crate) struct ClaimRow {
    pub(crate) committed_offset: i64,
    pub(crate) batch_retry_count: i32,
    pub(crate) next_offset: i64,
    pub(crate) deleted: Option<Vec<i64>>,
    pub(crate) base_offset: Option<i64>,
    pub(crate) msg_count: Option<i32>,
    pub(crate) frames: Option<Vec<u8>>,
}

/// Held runs as the one-statement pops take them: `$6` partition ids, `$7` first and `$8`
/// last bases ([`SegmentCache::held_runs`]).
#[derive(Default)]
pub(crate) struct HeldRuns {
    pub(crate) pids: Vec<i64>,
    pub(crate) from: Vec<i64>,
    pub(crate) to: Vec<i64>,
}

impl<I: Iterator<Item = (i64, i64, i64)>> From<I> for HeldRuns {
    fn from(runs: I) -> Self {
        let mut held = Self::default();
        for (pid, from, to) in runs {
            held.pids.push(pid);
            held.from.push(from);
            held.to.push(to);
        }
        held
    }
}

/// On a queue with delayed processing: the first of the segments `$2` of partition `$1` whose
/// delay of `$3` seconds, counted from its commit by PostgreSQL's clock, has not ended, and
/// when it ends. A broker's clock (the frames' arrival times) never decides a delay: it may be
/// off from PostgreSQL's or jump.
pub(crate) const HELD_BACK_SQL: &str = "
SELECT base_offset, created_at + make_interval(secs => $3) AS visible_at
  FROM queen.segments
 WHERE partition_id = $1
   AND base_offset = ANY($2)
   AND created_at + make_interval(secs => $3) > now()
 ORDER BY base_offset
 LIMIT 1";

/// Partitions whose cached segments are named to [`READY_SQL`] as not to be sent (those
/// given segments most recently: what live consumers read).
pub(crate) const HELD_PARTITIONS: usize = 1024;

/// The CTE `q` both one-statement pops start with: the queue named `$1` with the group `$2`'s
/// subscription, when this statement serves it (no window buffer, no delayed processing, a
/// group that does not conflate).
macro_rules! one_statement_queue {
    () => {
        "
WITH q AS (
    SELECT q.id, q.lease_time, s.scan_xid, s.scan_pid
      FROM queen.queues q
      JOIN queen.consumer_subscriptions s
        ON s.queue_id = q.id AND s.consumer_group = $2
     WHERE q.name = $1
       AND q.window_buffer = 0
       AND q.delayed_processing = 0
       AND NOT s.conflation
)"
    };
}

/// The offsets of deleted messages in the range `claim` (a CTE with `partition_id`,
/// `committed_offset` and `leased_to`) just leased, as the select-list item `deleted`.
macro_rules! claimed_deleted {
    () => {
        "
       (SELECT array_agg(d.msg_offset ORDER BY d.msg_offset)
          FROM queen.deleted_messages d
         WHERE d.partition_id = claim.partition_id
           AND d.msg_offset >= claim.committed_offset
           AND d.msg_offset < claim.leased_to) AS deleted,"
    };
}
pub(crate) use claimed_deleted;

/// The segments covering the range `claim` just leased (from the one holding its committed
/// offset), in offset order, as `s` joined to each claimed row (NULL columns when none).
macro_rules! claimed_segments {
    () => {
        "
  LEFT JOIN LATERAL (
        SELECT sg.base_offset, sg.msg_count, sg.frames
          FROM queen.segments sg
         WHERE sg.partition_id = claim.partition_id
           AND sg.base_offset < claim.leased_to
           AND sg.base_offset >= COALESCE((SELECT max(x.base_offset)
                                             FROM queen.segments x
                                            WHERE x.partition_id = claim.partition_id
                                              AND x.base_offset <= claim.committed_offset),
                                          claim.committed_offset)
         ORDER BY sg.base_offset
       ) s ON true"
    };
}
pub(crate) use claimed_segments;

/// The end both one-statement pops share: claim the `target` rows (lease `$3` for owner `$4`,
/// range `committed .. committed + $5 - before` capped at the partition's end, where `before`
/// is what the rows ahead of it in `ord` take of the batch) and return the covering segments,
/// without the frames of those in the held runs `$6`/`$7`/`$8`, partition by partition in `ord`.
macro_rules! one_statement_claim {
    () => {
        concat!(
            "),
claim AS (
    UPDATE queen.partition_consumers c
       SET lease_id = $3,
           lease_owner = $4,
           lease_acquired_at = now(),
           lease_expires_at = now() + (SELECT CASE WHEN q.lease_time > 0 THEN q.lease_time
                                                   ELSE 60 END
                                         FROM q) * interval '1 second',
           attention_at = NULL,
           leased_from = c.committed_offset,
           leased_to = GREATEST(c.committed_offset,
                                LEAST(c.committed_offset + ($5 - t.before), p.next_offset))
      FROM target t, queen.partitions p
     WHERE c.partition_id = t.partition_id
       AND c.consumer_group = t.consumer_group
       AND p.id = t.partition_id
 RETURNING c.partition_id, p.uuid, p.name, c.committed_offset, c.batch_retry_count,
           p.next_offset, c.leased_to, t.ord
)
SELECT q.id AS queue_id, q.lease_time,
       claim.partition_id, claim.uuid, claim.name, claim.committed_offset,
       claim.batch_retry_count, claim.next_offset,
",
            claimed_deleted!(),
            "
       s.base_offset, s.msg_count,
       CASE WHEN s.base_offset
                 BETWEEN ($7::int8[])[array_position($6::int8[], claim.partition_id)]
                     AND ($8::int8[])[array_position($6::int8[], claim.partition_id)]
            THEN NULL ELSE s.frames END AS frames
  FROM claim
 CROSS JOIN q",
            claimed_segments!(),
            "
 ORDER BY claim.ord, s.base_offset"
        )
    };
}

/// The queue-level pop in one statement, for the common case: claim up to `$9` partitions of
/// the queue that the group has a row for, with messages past its committed offset and no live
/// lease, taken from three lists in turn: leases that ran out (oldest first), rows released
/// with messages left (in release order), partitions written since the group's watermark (of
/// the 16 written longest ago, those claimed least recently); no row is on two lists. Each
/// list is read from its index only as far as the claimable rows the pop still has room for,
/// skipping rows another claim is locking (`SKIP LOCKED`), and not at all when the earlier
/// ones filled the room, so a pop reads a handful of rows however many partitions wait. The
/// batch `$5` is shared out in that order: each partition takes what it holds of what the ones
/// before it left, and a partition nothing is left for is not claimed. It records each leased range and returns
/// the covering segments with the queue's options, partition after partition, without the
/// frames of the segments the broker holds: for each partition in `$6`, those with bases from
/// `$7` to `$8` (the run of consecutive segments it holds,
/// [`crate::storage::segments::cache::SegmentCache::held_runs`]). No row: nothing claimable
/// among those lists, or a case this statement leaves to the full pop (no subscription yet, a
/// window buffer, delayed processing, a conflating group); the caller then runs the full pop,
/// which also settles and rescans.
pub const READY_SQL: &str = concat!(
    one_statement_queue!(),
    ",
expired AS (
    -- Leases that ran out, oldest first: walked in index order (the queue id is a parameter
    -- of the scan, not a join, so the index gives the order), the first rows not locked by a
    -- concurrent pop that still have messages win; nothing after them is read.
    SELECT c.partition_id, c.consumer_group, 1 AS list, c.lease_expires_at AS since,
           p.next_offset - c.committed_offset AS waiting
      FROM queen.partition_consumers c
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE c.queue_id = (SELECT id FROM q)
       AND c.consumer_group = $2
       AND c.lease_expires_at <= now()
       AND c.committed_offset < p.next_offset
     ORDER BY c.lease_expires_at
     LIMIT $9
       FOR UPDATE OF c SKIP LOCKED
), released AS (
    -- Rows released with messages left behind, in the order they were released (a queue of
    -- partitions waiting for a consumer), read the same way.
    SELECT c.partition_id, c.consumer_group, 2 AS list, c.attention_at AS since,
           p.next_offset - c.committed_offset AS waiting
      FROM queen.partition_consumers c
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE c.queue_id = (SELECT id FROM q)
       AND c.consumer_group = $2
       AND c.attention_at <= now()
       AND c.lease_expires_at IS NULL
       AND c.committed_offset < p.next_offset
     ORDER BY c.attention_at
     LIMIT $9
       FOR UPDATE OF c SKIP LOCKED
), recent AS MATERIALIZED (
    -- The 16 partitions written longest ago since the watermark, read from the write-order
    -- index once (materialized: never re-read per row of a join, whatever the planner thinks
    -- of tables it has not analyzed yet).
    SELECT w.id, w.next_offset
      FROM queen.partitions w
     WHERE w.queue_id = (SELECT id FROM q)
       AND (w.last_write_xid, w.id) >= ((SELECT scan_xid FROM q), (SELECT scan_pid FROM q))
     ORDER BY w.last_write_xid, w.id
     LIMIT 16
), written AS (
    -- Of those, the ones claimed least recently (a partition written all the time is always
    -- among the newest writes, so the write order alone would keep it waiting); the group's
    -- rows are probed by primary key, once.
    SELECT c.partition_id, c.consumer_group, 3 AS list,
           COALESCE(c.lease_acquired_at, '-infinity') AS since,
           (SELECT r.next_offset FROM recent r WHERE r.id = c.partition_id)
             - c.committed_offset AS waiting
      FROM queen.partition_consumers c
     WHERE c.partition_id = ANY (ARRAY(SELECT r.id FROM recent r))
       AND c.consumer_group = $2
       AND c.lease_expires_at IS NULL
       AND (c.attention_at IS NULL OR c.attention_at > now())
       AND c.committed_offset < (SELECT r.next_offset FROM recent r WHERE r.id = c.partition_id)
     ORDER BY c.lease_acquired_at NULLS FIRST
     LIMIT $9
       FOR UPDATE OF c SKIP LOCKED
), listed AS (
    -- The lists in turn (no row is on two of them), a later one read only as far as the
    -- earlier ones left room.
    SELECT * FROM expired
    UNION ALL
    SELECT * FROM released
    UNION ALL
    SELECT * FROM written
     LIMIT $9
), shared AS (
    -- The lists in turn, each partition with what the ones before it take of the batch.
    SELECT l.partition_id, l.consumer_group,
           row_number() OVER w AS ord,
           (sum(l.waiting) OVER w)::int8 - l.waiting AS before
      FROM listed l
    WINDOW w AS (ORDER BY l.list, l.since, l.partition_id)
), target AS (
    SELECT s.partition_id, s.consumer_group, s.ord, s.before
      FROM shared s
     WHERE s.before < $5
",
    one_statement_claim!()
);

/// The hand-off claim ([`crate::storage::consume::handoff`]): the one-statement pop's claim of a
/// partition this broker released with messages left behind, named by `$9` instead of
/// searched for in the three lists. It claims nothing when the lease is taken (or being
/// claimed right now), nothing waits past the committed offset, the partition is not of the
/// queue `$1`, or the queue is one the one-statement pop leaves to the full pop. Same
/// parameters `$1`..`$8` and rows as [`READY_SQL`].
pub const HANDOFF_SQL: &str = concat!(
    one_statement_queue!(),
    ",
target AS (
    SELECT c.partition_id, c.consumer_group, 1::int8 AS ord, 0::int8 AS before
      FROM queen.partition_consumers c
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE c.partition_id = $9
       AND c.consumer_group = $2
       AND c.queue_id = (SELECT id FROM q)
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < p.next_offset
       FOR UPDATE OF c SKIP LOCKED
",
    one_statement_claim!()
);

/// One row of [`READY_SQL`] and [`HANDOFF_SQL`] (and of the grouped hand-off claim,
/// [`crate::storage::consume::claim_group`]).
#[derive(sqlx::FromRow)]
pub struct ReadyRow {
    pub(crate) queue_id: i64,
    pub(crate) lease_time: i32,
    pub(crate) partition_id: i64,
    pub(crate) uuid: Uuid,
    pub(crate) name: String,
    pub(crate) committed_offset: i64,
    pub(crate) batch_retry_count: i32,
    pub(crate) next_offset: i64,
    pub(crate) deleted: Option<Vec<i64>>,
    pub(crate) base_offset: Option<i64>,
    pub(crate) msg_count: Option<i32>,
    pub(crate) frames: Option<Vec<u8>>,
}

/// Releases leases claimed ahead that no pop took (and claims whose answer was lost), by lease id (each covers one partition): the
/// row asks for attention (messages wait past its committed offset, or the claim would not
/// have taken it), unless another statement ended the lease meanwhile. At shutdown it is run for
/// every lease not taken, booked or not: a claim whose task stopped with the server's workers
/// was never booked, but its statement, run by the claim group, may have committed.
pub(crate) const RELEASE_SQL: &str = "
UPDATE queen.partition_consumers
   SET lease_expires_at = NULL,
       attention_at = now()
 WHERE lease_id = ANY($1)
   AND lease_expires_at IS NOT NULL";
