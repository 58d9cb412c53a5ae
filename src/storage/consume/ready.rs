//! The common case in one statement: a queue-level pop claims the partition this broker
//! handed off ([`HANDOFF_SQL`]) or the least recently claimed ready one ([`READY_SQL`]) and reads
//! its segments in the same statement; the full pop in `mod.rs` runs only when this claims
//! nothing.

use uuid::Uuid;

use crate::storage::consume::ahead::Ahead;
use crate::storage::consume::claim_group::ClaimJob;
use crate::storage::consume::conns::LazyConn;
use crate::storage::consume::statements::{
    HeldRuns, ReadyRow, HANDOFF_SQL, HELD_PARTITIONS, READY_SQL,
};
use crate::storage::consume::{
    finish, Claimed, Collect, PopRequest, Popped, QueueInfo, Subscription, Take,
};
use crate::storage::error::StorageError;

/// Hand-offs a pop tries at most before it reads the one-statement pop's lists (a hand-off
/// goes stale when another pop took the partition first).
pub(crate) const HANDOFF_TRIES: usize = 2;

/// The queue-level pop by [`HANDOFF_SQL`] (a partition this broker released with messages
/// left, when one waits) or [`READY_SQL`], one statement per claimed partition; `None` when it
/// claimed nothing (the caller then runs the full pop). A lease claimed `ahead` is delivered
/// first, as if this pop had claimed it (its lease id is the pop's).
pub(crate) async fn pop_ready(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
    ahead: Option<Ahead>,
) -> Result<Option<Popped>, StorageError> {
    let lease_id = ahead.as_ref().map_or_else(Uuid::now_v7, |a| a.lease);
    // What the statements claim under `lease_id` is released if the pop ends without its
    // answer (an error after a claim, a connection lost mid-statement, the time limit).
    let mut lost = req.claims.guard(lease_id, !req.auto_ack);
    let popped = claim_and_deliver(conn, req, ahead, lease_id).await?;
    lost.disarm();
    Ok(popped)
}

/// [`pop_ready`]'s claims and deliveries under `lease_id`.
async fn claim_and_deliver(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
    ahead: Option<Ahead>,
    lease_id: Uuid,
) -> Result<Option<Popped>, StorageError> {
    let mut ahead = ahead.map(|a| (a.partition_id, a.rows));
    // What the one-statement pop is told not to send, read once and only if it runs.
    let mut all_held: Option<HeldRuns> = None;
    let sub = Subscription {
        from: None,
        scan: (0, 0),
        // The one-statement pops never claim for a conflating group.
        conflation: false,
    };
    let mut queue: Option<QueueInfo> = None;
    let mut remaining = req.batch.max(1);
    let mut deliveries = Vec::new();
    let mut handoffs_tried = 0;
    // Whether the one-statement pop ran and found nothing: hand-offs are then tried even when
    // it was its turn.
    let mut ready_empty = false;
    while remaining > 0 && deliveries.len() < req.partitions.max(1) {
        let (handoff, rows) = match ahead.take() {
            Some((partition_id, rows)) => (Some(partition_id), rows),
            None => {
                let handoff = match (handoffs_tried < HANDOFF_TRIES, ready_empty) {
                    (false, _) => None,
                    (true, false) => req.handoffs.next(req.queue, req.group),
                    (true, true) => req.handoffs.take(req.queue, req.group),
                };
                if handoff.is_none() && ready_empty {
                    break;
                }
                handoffs_tried += usize::from(handoff.is_some());
                let rows = claim(conn, req, lease_id, remaining, handoff, &mut all_held).await?;
                (handoff, rows)
            }
        };
        let Some(head) = rows.first() else {
            // A hand-off taken meanwhile or with nothing left: the next one, or the lists.
            // The lists empty: a hand-off, if one waits.
            ready_empty |= handoff.is_none();
            continue;
        };
        if handoff.is_none() {
            req.handoffs.forget(req.queue, req.group, head.partition_id);
        }
        let info = queue.get_or_insert_with(|| QueueInfo {
            id: head.queue_id,
            name: req.queue.to_string(),
            lease_secs: head.lease_time,
            delay_secs: 0,
            window_secs: 0,
        });
        let partition_id = head.partition_id;
        let mut claimed = Claimed {
            partition_id,
            uuid: head.uuid,
            name: head.name.clone(),
            committed: head.committed_offset,
            retry_count: head.batch_retry_count,
            next_offset: head.next_offset,
            recorded: true,
            deleted: head.deleted.clone().unwrap_or_default(),
            segments: Vec::with_capacity(rows.len()),
        };
        let mut evicted = false;
        for r in rows {
            let Some(base) = r.base_offset else {
                continue;
            };
            let count = r.msg_count.unwrap_or(0).into();
            match r.frames {
                Some(frames) => {
                    claimed
                        .segments
                        .push(req.cache.insert_read(partition_id, base, count, frames))
                }
                None => match req.cache.get(partition_id, base) {
                    Some(seg) => claimed.segments.push(seg),
                    // Evicted since the statement was sent: the range is read again.
                    None => evicted = true,
                },
            }
        }
        if evicted {
            claimed.segments.clear();
        }
        let mut collect = Collect {
            req,
            queue: info,
            sub: &sub,
            lease_id,
            remaining,
            slots: req.partitions.max(1),
            deliveries: std::mem::take(&mut deliveries),
        };
        let taken = collect.deliver(conn, claimed).await?;
        remaining = collect.remaining;
        deliveries = collect.deliveries;
        if !matches!(taken, Take::Taken) {
            break;
        }
    }
    Ok(match queue {
        Some(q) if !deliveries.is_empty() => {
            Some(finish(req, &q.name, lease_id, deliveries, false))
        }
        _ => None,
    })
}

/// One claim of [`pop_ready`]: the hand-off `handoff` (grouped with concurrent pops' claims,
/// or alone when the group's statement failed), or the one-statement pop when none is named.
pub(crate) async fn claim(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
    lease_id: Uuid,
    remaining: usize,
    handoff: Option<i64>,
    all_held: &mut Option<HeldRuns>,
) -> Result<Vec<ReadyRow>, StorageError> {
    let Some(partition_id) = handoff else {
        let held =
            all_held.get_or_insert_with(|| req.cache.held_runs(HELD_PARTITIONS).into_iter().into());
        return Ok(ready_statement(READY_SQL, req, lease_id, remaining, held)
            .fetch_all(conn.get().await?)
            .await?);
    };
    // A hand-off names its partition: only that one's held run is sent.
    let held = req.cache.held_run(partition_id);
    let job = ClaimJob {
        queue: req.queue.to_string(),
        group: req.group.to_string(),
        lease: lease_id,
        want: remaining as i64,
        partition_id,
        held: held.map(|(_, from, to)| (from, to)),
    };
    if let Some(rows) = req.claims.claim(job).await {
        return Ok(rows);
    }
    let held = HeldRuns::from(held.into_iter());
    Ok(
        ready_statement(HANDOFF_SQL, req, lease_id, remaining, &held)
            .bind(partition_id)
            .fetch_all(conn.get().await?)
            .await?,
    )
}

/// [`READY_SQL`] or [`HANDOFF_SQL`] with the parameters `$1`..`$8` both take (the hand-off
/// claim binds its partition as `$9` after them).
pub(crate) fn ready_statement<'q>(
    sql: &'q str,
    req: &'q PopRequest<'_>,
    lease_id: Uuid,
    remaining: usize,
    held: &'q HeldRuns,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, ReadyRow, sqlx::postgres::PgArguments> {
    sqlx::query_as(sql)
        .bind(req.queue)
        .bind(req.group)
        .bind(lease_id)
        .bind(req.owner)
        .bind(remaining as i64)
        .bind(&held.pids)
        .bind(&held.from)
        .bind(&held.to)
}
