//! The common case in one statement: a queue-level pop claims the partition this broker
//! handed off ([`HANDOFF_SQL`]) or as many ready ones as it has room for ([`READY_SQL`]) and
//! reads their segments in the same statement; the full pop in `mod.rs` runs only when this
//! claims nothing.

use uuid::Uuid;

use crate::storage::consume::ahead::Ahead;
use crate::storage::consume::claim_group::ClaimJob;
use crate::storage::consume::conns::LazyConn;
use crate::storage::consume::statements::{
    HeldRuns, ReadyRow, HANDOFF_SQL, HELD_PARTITIONS, READY_SQL,
};
use crate::storage::consume::{
    finish, Claimed, Collect, Delivery, PopRequest, Popped, QueueInfo, Subscription, Take,
};
use crate::storage::error::StorageError;

/// Hand-offs a pop tries at most before it reads the one-statement pop's lists (a hand-off
/// goes stale when another pop took the partition first).
pub(crate) const HANDOFF_TRIES: usize = 2;

/// The queue-level pop by [`HANDOFF_SQL`] (a partition this broker released with messages
/// left, when one waits, one statement each) or [`READY_SQL`] (as many partitions as the pop
/// has room for, in one statement); `None` when it claimed nothing (the caller then runs the
/// full pop). A lease claimed `ahead` is delivered first, as if this pop had claimed it (its
/// lease id is the pop's).
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
    let mut deliver = Deliver {
        req,
        lease_id,
        sub: Subscription {
            from: None,
            scan: (0, 0),
            // The one-statement pops never claim for a conflating group.
            conflation: false,
        },
        queue: None,
        remaining: req.batch.max(1),
        slots: req.partitions.max(1),
        deliveries: Vec::new(),
    };
    let mut handoffs_tried = 0;
    // Whether the one-statement pop ran and claimed fewer partitions than it was asked for:
    // hand-offs are then tried even when it was its turn, and it is not run again.
    let mut ready_empty = false;
    while deliver.remaining > 0 && deliver.deliveries.len() < deliver.slots {
        let open = deliver.slots - deliver.deliveries.len();
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
                let want = (deliver.remaining, open);
                let rows = claim(conn, req, lease_id, want, handoff, &mut all_held).await?;
                (handoff, rows)
            }
        };
        // Whether every partition claimed here was handed out: after one that was not (released
        // empty), the pop ends with what it has, as the lists could offer it again.
        let mut all_taken = true;
        let mut claimed = 0;
        let mut rows = rows.into_iter().peekable();
        while let Some(head) = rows.next() {
            claimed += 1;
            let partition_id = head.partition_id;
            let mut part = vec![head];
            while let Some(row) = rows.next_if(|r| r.partition_id == partition_id) {
                part.push(row);
            }
            if handoff.is_none() {
                req.handoffs.forget(req.queue, req.group, partition_id);
            }
            // Every partition claimed is delivered or released, even past an empty one: its
            // lease is this pop's.
            all_taken &= matches!(deliver.partition(conn, part).await?, Take::Taken);
        }
        // The lists hold no more than the one-statement pop claimed (a hand-off taken meanwhile
        // or with nothing left just goes on to the next).
        ready_empty |= handoff.is_none() && claimed < open;
        if !all_taken {
            break;
        }
    }
    Ok(match deliver.queue {
        Some(q) if !deliver.deliveries.is_empty() => {
            Some(finish(req, &q.name, lease_id, deliver.deliveries, false))
        }
        _ => None,
    })
}

/// What [`claim_and_deliver`] has handed out so far, and what is left of the pop.
struct Deliver<'r, 'a> {
    req: &'r PopRequest<'a>,
    lease_id: Uuid,
    sub: Subscription,
    /// The queue, from the first claim's rows.
    queue: Option<QueueInfo>,
    remaining: usize,
    slots: usize,
    deliveries: Vec<Delivery>,
}

impl Deliver<'_, '_> {
    /// Delivers (or releases, when nothing is deliverable) one claimed partition from its
    /// rows (`rows[0]` carries the claim, each row one covering segment); whether it was
    /// handed out.
    async fn partition(
        &mut self,
        conn: &mut LazyConn<'_>,
        rows: Vec<ReadyRow>,
    ) -> Result<Take, StorageError> {
        let req = self.req;
        let head = &rows[0];
        let info = self.queue.get_or_insert_with(|| QueueInfo {
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
            sub: &self.sub,
            lease_id: self.lease_id,
            remaining: self.remaining,
            slots: self.slots,
            deliveries: std::mem::take(&mut self.deliveries),
        };
        let taken = collect.deliver(conn, claimed).await?;
        self.remaining = collect.remaining;
        self.deliveries = collect.deliveries;
        Ok(taken)
    }
}

/// One claim of [`pop_ready`] for `(messages, partitions)` at most: the hand-off `handoff`
/// (one partition, grouped with concurrent pops' claims, or alone when the group's statement
/// failed), or the one-statement pop when none is named.
async fn claim(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
    lease_id: Uuid,
    (remaining, partitions): (usize, usize),
    handoff: Option<i64>,
    all_held: &mut Option<HeldRuns>,
) -> Result<Vec<ReadyRow>, StorageError> {
    let Some(partition_id) = handoff else {
        let held =
            all_held.get_or_insert_with(|| req.cache.held_runs(HELD_PARTITIONS).into_iter().into());
        return Ok(ready_statement(READY_SQL, req, lease_id, remaining, held)
            .bind(partitions as i64)
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

/// [`READY_SQL`] or [`HANDOFF_SQL`] with the parameters `$1`..`$8` both take (the one-statement
/// pop binds its partition count as `$9` after them, the hand-off claim its partition).
fn ready_statement<'q>(
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
