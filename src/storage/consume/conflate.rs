//! Conflation (reference §2.8, docs/consuming-2x.md): a consumer group that only wants the
//! latest message of each partition.
//!
//! The policy belongs to the (queue, group) and is stored with the group's subscription
//! (`consumer_subscriptions.conflation`) when the group first registers on the queue, its first
//! pop; the stored value wins afterwards. A conflating claim of a partition delivers only its
//! newest visible message (not deleted, past its delay) and retires everything behind it for
//! that group at delivery: the committed offset moves to the newest message, which is leased
//! alone (`leased_from .. leased_to` is that one offset), so its ack commits it like any other
//! and a failed one is delivered again (or, if a newer message arrived meanwhile, retired by
//! it). Other groups' cursors are untouched.
//!
//! The one-statement pops, the hand-off claims and the leases claimed ahead never serve a
//! conflating group (their statements skip such subscriptions): its pops take the full pop,
//! which reads the subscription and claims through `take` (below).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::consume::conns::LazyConn;
use crate::storage::consume::group_rows::first_claim;
use crate::storage::consume::read::sent_or_held;
use crate::storage::consume::{Candidate, Claimed, Collect, Take};
use crate::storage::error::StorageError;
use crate::storage::segments::cache::{CachedSegment, SegmentCache};

/// The claim of a partition the group already has a row on, for a conflating pop: the lease as
/// the ordinary claim takes it (`$3` for owner `$4`, `$5` seconds; skipped when another claim
/// is locking the row), with no range recorded yet.
const CLAIM_SQL: &str = "
WITH target AS (
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
     WHERE c.partition_id = $1
       AND c.consumer_group = $2
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < (SELECT next_offset FROM queen.partitions WHERE id = $1)
       FOR UPDATE OF c SKIP LOCKED
)
UPDATE queen.partition_consumers c
   SET lease_id = $3,
       lease_owner = $4,
       lease_acquired_at = now(),
       lease_expires_at = now() + $5 * interval '1 second',
       attention_at = NULL,
       leased_from = c.committed_offset,
       leased_to = c.committed_offset
  FROM target t, queen.partitions p
 WHERE c.partition_id = t.partition_id
   AND c.consumer_group = t.consumer_group
   AND p.id = $1
RETURNING c.committed_offset, c.batch_retry_count, p.next_offset";

/// Retires everything of the claimed row below `$4` (the newest visible message) and leases
/// that message alone. The batch retry counter starts over when the message is a new one (the
/// one it counted for is retired), and stays when the same message is delivered again.
const RETIRE_SQL: &str = "
UPDATE queen.partition_consumers
   SET committed_offset = $4,
       leased_from = $4,
       leased_to = $4 + 1,
       total_consumed = total_consumed + ($4 - committed_offset),
       last_consumed_at = CASE WHEN $4 > committed_offset THEN now() ELSE last_consumed_at END,
       batch_retry_count = CASE WHEN $4 > committed_offset THEN 0 ELSE batch_retry_count END,
       retry_lease_id = CASE WHEN $4 > committed_offset THEN NULL ELSE retry_lease_id END
 WHERE partition_id = $1
   AND consumer_group = $2
   AND lease_id = $3
RETURNING batch_retry_count";

/// The newest segment of partition `$1` starting below `$2`, without its frames when its base
/// is in `$3` (held by the broker), with the offsets deleted one by one inside it, and when a
/// delay of `$4` seconds from its commit ends, by PostgreSQL's clock (`NULL`: already ended).
const SEGMENT_SQL: &str = "
SELECT s.base_offset, s.msg_count,
       CASE WHEN s.base_offset = ANY($3) THEN NULL ELSE s.frames END AS frames,
       (SELECT array_agg(d.msg_offset)
          FROM queen.deleted_messages d
         WHERE d.partition_id = $1
           AND d.msg_offset >= s.base_offset
           AND d.msg_offset < s.base_offset + s.msg_count) AS deleted,
       CASE WHEN s.created_at + make_interval(secs => $4) > now()
            THEN s.created_at + make_interval(secs => $4) END AS visible_at
  FROM queen.segments s
 WHERE s.partition_id = $1
   AND s.base_offset < $2
 ORDER BY s.base_offset DESC
 LIMIT 1";

/// One row of [`SEGMENT_SQL`]: base offset, message count, frames (unless held), deleted
/// offsets, the end of its delay when still ahead.
type SegmentRow = (
    i64,
    i32,
    Option<Vec<u8>>,
    Option<Vec<i64>>,
    Option<DateTime<Utc>>,
);

/// What a conflating claim found in `committed .. next_offset`.
#[derive(Debug)]
enum Newest {
    /// The newest visible message's offset and the segment holding it.
    Visible(i64, Arc<CachedSegment>),
    /// Nothing visible yet; the oldest delayed message becomes visible then.
    Delayed(DateTime<Utc>),
    /// Nothing at all: every message left was deleted (or retention removed it).
    Gone,
}

/// Claims `row` for a conflating group and hands out its newest visible message, retiring
/// everything behind it for the group.
///
/// # Errors
///
/// Any database error, or a segment that does not decode.
pub(super) async fn take(
    pop: &mut Collect<'_, '_>,
    conn: &mut PgConnection,
    row: &Candidate,
) -> Result<Take, StorageError> {
    let lease_secs = super::lease_length::of_queue(pop.queue.lease_secs);
    let claimed: Option<(i64, i32, i64)> = if row.committed.is_some() {
        sqlx::query_as(CLAIM_SQL)
            .bind(row.id)
            .bind(pop.req.group)
            .bind(pop.lease_id)
            .bind(pop.req.owner)
            .bind(lease_secs)
            .fetch_optional(&mut *conn)
            .await?
    } else {
        first_claim(
            conn,
            row.id,
            pop.req.group,
            pop.lease_id,
            pop.req.owner,
            lease_secs,
            pop.sub.from,
        )
        .await?
    };
    let Some((committed, _, next_offset)) = claimed else {
        return Ok(Take::Lost);
    };
    let newest = newest_visible(
        conn,
        pop.req.cache,
        row.id,
        committed,
        next_offset,
        pop.queue.delay_secs,
    )
    .await?;
    let (offset, segment) = match newest {
        Newest::Visible(offset, segment) => (offset, segment),
        Newest::Delayed(at) => {
            pop.release_empty(conn, row.id, Some(at), committed).await?;
            return Ok(Take::Empty);
        }
        Newest::Gone => {
            pop.release_empty(conn, row.id, None, next_offset).await?;
            return Ok(Take::Empty);
        }
    };
    let retry_count: Option<i32> = sqlx::query_scalar(RETIRE_SQL)
        .bind(row.id)
        .bind(pop.req.group)
        .bind(pop.lease_id)
        .bind(offset)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(retry_count) = retry_count else {
        // The lease ended between the two statements (a seek, a group deletion): not ours.
        return Ok(Take::Lost);
    };
    pop.deliver(
        &mut LazyConn::Held(conn),
        Claimed {
            partition_id: row.id,
            uuid: row.uuid,
            name: row.name.clone(),
            committed: offset,
            retry_count,
            next_offset: offset + 1,
            recorded: true,
            deleted: Vec::new(),
            segments: vec![segment],
        },
    )
    .await
}

/// The newest message of partition `partition_id` in `from .. end` that a consumer may see
/// now: not deleted and, on a queue with delayed processing (`delay_secs`), past its delay —
/// counted from its segment's commit by PostgreSQL's clock, whatever this broker's clock says.
/// Reads the segments newest first, one statement each, until one holds such a message (almost
/// always the first: a delay holds back only the newest messages).
async fn newest_visible(
    conn: &mut PgConnection,
    cache: &SegmentCache,
    partition_id: i64,
    from: i64,
    end: i64,
    delay_secs: i32,
) -> Result<Newest, StorageError> {
    let held = cache.from_offset(partition_id, from);
    let held_bases: Vec<i64> = held.iter().map(|s| s.base_offset).collect();
    let mut below = end;
    let mut delayed: Option<DateTime<Utc>> = None;
    while below > from {
        let row: Option<SegmentRow> = sqlx::query_as(SEGMENT_SQL)
            .bind(partition_id)
            .bind(below)
            .bind(&held_bases)
            .bind(delay_secs)
            .fetch_optional(&mut *conn)
            .await?;
        let Some((base, count, bytes, deleted, visible_at)) = row else {
            break;
        };
        if let Some(at) = visible_at {
            // Walking back, the last one seen is the oldest: the first to show.
            delayed = Some(at);
            below = base;
            continue;
        }
        let segment = sent_or_held(cache, &held, partition_id, base, count.into(), bytes)?;
        let deleted = deleted.unwrap_or_default();
        let last = below.min(base + i64::from(count));
        if let Some(offset) = (base.max(from)..last)
            .rev()
            .find(|offset| !deleted.contains(offset))
        {
            return Ok(Newest::Visible(offset, segment));
        }
        below = base;
    }
    Ok(match delayed {
        Some(at) => Newest::Delayed(at),
        None => Newest::Gone,
    })
}

/// The stored conflation policy of `group` on the queue `queue`: `false` when the group has not
/// registered there (or is queue mode, which never conflates).
///
/// # Errors
///
/// Any database error.
pub async fn stored_policy(
    conn: &mut PgConnection,
    queue: &str,
    group: &str,
) -> Result<bool, StorageError> {
    let stored: Option<bool> = sqlx::query_scalar(
        "SELECT s.conflation
           FROM queen.consumer_subscriptions s
           JOIN queen.queues q ON q.id = s.queue_id
          WHERE q.name = $1
            AND s.consumer_group = $2",
    )
    .bind(queue)
    .bind(group)
    .fetch_optional(conn)
    .await?;
    Ok(stored.unwrap_or(false))
}
