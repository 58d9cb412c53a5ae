//! What consumer state says about stored messages, for the admin routes: per partition, which
//! offsets are completed, which are under a live lease, which groups have consumed what.
//!
//! The groups of a partition and how far each has consumed come from the view
//! `queen.partition_group_progress` (`migrations/0004_completed_retention.up.sql`), the same
//! definition completed retention reads: the groups subscribed to the queue (queue mode
//! included) plus any group with a cursor on the partition; a group without a cursor on the
//! partition has consumed nothing of it.
//!
//! The rules, as Queen 0.15 applies them (`list_messages_v1`):
//! - Queue mode (the partition has the group `__QUEUE_MODE__`), and a partition without any
//!   group: offsets below the queue-mode cursor are `completed`; offsets inside the live
//!   queue-mode lease's leased range (from the cursor on) are `processing`; the rest `pending`.
//!   Named groups next to queue mode ("hybrid") only show in `busStatus`.
//! - Bus mode (named groups only): `completed` once every group has consumed it, else
//!   `pending`; there is no `processing` (each group has its own lease).
//! - A message some group dead-lettered is `dead_letter`, whatever the above says.
//!
//! Everything here is read set-based: one statement for any number of partitions, one for the
//! dead letters of any number of offset ranges; the rules are applied in Rust.

use std::ops::Range;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::consume::QUEUE_MODE;
use crate::storage::error::StorageError;

/// The consumer state of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Progress {
    /// Queue mode is one of the partition's groups.
    pub has_queue_mode: bool,
    /// Everything below this is consumed by queue mode (0 without it).
    pub queue_consumed: i64,
    /// The named groups of the partition, by name.
    pub bus_groups: Vec<String>,
    /// How far each of them has consumed (same order).
    pub bus_consumed: Vec<i64>,
    /// The live queue-mode lease's leased range start (`None` without a live lease).
    pub lease_from: Option<i64>,
    /// Its end (exclusive).
    pub lease_to: Option<i64>,
    /// When it runs out.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// How a partition (or a set of them) is consumed, with Queen's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nobody consumes.
    None,
    /// Queue mode only.
    Queue,
    /// Named groups only.
    Bus,
    /// Both.
    Hybrid,
}

impl Mode {
    /// From "queue mode is there" and "how many named groups".
    pub fn of(has_queue_mode: bool, bus_groups: usize) -> Self {
        match (has_queue_mode, bus_groups > 0) {
            (false, false) => Self::None,
            (true, false) => Self::Queue,
            (false, true) => Self::Bus,
            (true, true) => Self::Hybrid,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Queue => "queue",
            Self::Bus => "bus",
            Self::Hybrid => "hybrid",
        }
    }
}

/// A message's state for its consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageStatus {
    /// Not consumed yet.
    Pending,
    /// Under a live lease.
    Processing,
    /// Consumed.
    Completed,
    /// Dead-lettered.
    DeadLetter,
}

impl MessageStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::DeadLetter => "dead_letter",
        }
    }

    /// From the wire name.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Processing,
            Self::Completed,
            Self::DeadLetter,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl Progress {
    /// Named groups only: a message is done when every one of them consumed it.
    pub fn bus_only(&self) -> bool {
        !self.has_queue_mode && !self.bus_consumed.is_empty()
    }

    /// How the partition is consumed.
    pub fn mode(&self) -> Mode {
        Mode::of(self.has_queue_mode, self.bus_consumed.len())
    }

    /// Offsets below this are `completed` (before dead letters are taken out).
    pub fn completed_below(&self) -> i64 {
        if self.bus_only() {
            self.bus_consumed.iter().copied().min().unwrap_or(0)
        } else {
            self.queue_consumed
        }
    }

    /// Offsets in this range are `processing` (before dead letters are taken out): the live
    /// queue-mode lease's range, from the cursor on. Empty in bus mode.
    pub fn processing(&self) -> Range<i64> {
        let done = self.completed_below();
        match (self.bus_only(), self.lease_from, self.lease_to) {
            (false, Some(from), Some(to)) => from.max(done)..to.max(done),
            _ => done..done,
        }
    }

    /// The status of the message at `offset` (`dead`: some group dead-lettered it).
    pub fn status(&self, offset: i64, dead: bool) -> MessageStatus {
        classify(offset, dead, self.completed_below(), &self.processing())
    }

    /// Its status by queue mode's cursor and lease alone (`queueStatus`): in bus mode this is
    /// `pending` (or `dead_letter`), as in Queen.
    pub fn queue_status(&self, offset: i64, dead: bool) -> MessageStatus {
        let lease = match (self.lease_from, self.lease_to) {
            (Some(from), Some(to)) => from.max(self.queue_consumed)..to.max(self.queue_consumed),
            _ => 0..0,
        };
        classify(offset, dead, self.queue_consumed, &lease)
    }

    /// The named groups that have consumed the message at `offset`.
    pub fn consumed_by(&self, offset: i64) -> usize {
        self.bus_consumed.iter().filter(|&&c| c > offset).count()
    }

    /// When the lease covering `offset` runs out, if it is `processing`.
    pub fn lease_expiry(&self, offset: i64) -> Option<DateTime<Utc>> {
        self.processing()
            .contains(&offset)
            .then_some(self.lease_expires_at)
            .flatten()
    }

    /// How many offsets of `range` have each status, given how many of its offsets are
    /// dead-lettered in total and inside the completed and processing ranges ([`dead_counts`]).
    pub fn tally(&self, range: Range<i64>, dead: &DeadCounts) -> StatusCounts {
        let total = (range.end - range.start).max(0);
        let overlap = |r: Range<i64>| (r.end.min(range.end) - r.start.max(range.start)).max(0);
        let completed = overlap(i64::MIN..self.completed_below()) - dead.completed;
        let processing = overlap(self.processing()) - dead.processing;
        let dead_letter = dead.total;
        StatusCounts {
            pending: total - completed - processing - dead_letter,
            processing,
            completed,
            dead_letter,
        }
    }
}

fn classify(
    offset: i64,
    dead: bool,
    completed_below: i64,
    processing: &Range<i64>,
) -> MessageStatus {
    if dead {
        MessageStatus::DeadLetter
    } else if offset < completed_below {
        MessageStatus::Completed
    } else if processing.contains(&offset) {
        MessageStatus::Processing
    } else {
        MessageStatus::Pending
    }
}

/// Messages per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusCounts {
    /// Pending.
    pub pending: i64,
    /// Processing.
    pub processing: i64,
    /// Completed.
    pub completed: i64,
    /// Dead-lettered.
    pub dead_letter: i64,
}

/// Dead-lettered offsets of one partition's stored range: all of them, and how many fall in
/// the completed and the processing range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadCounts {
    /// Distinct dead-lettered offsets.
    pub total: i64,
    /// Of which below [`Progress::completed_below`].
    pub completed: i64,
    /// Of which inside [`Progress::processing`].
    pub processing: i64,
}

/// The columns of [`Progress`] for the partition aliased `p`, with [`PROGRESS_JOINS`].
pub(crate) const PROGRESS_COLUMNS: &str = "gp.has_queue_mode, gp.queue_consumed, \
     gp.bus_groups, gp.bus_consumed, ql.leased_from AS lease_from, ql.leased_to AS lease_to, \
     ql.lease_expires_at";

/// Joins that make [`PROGRESS_COLUMNS`] available for the partition aliased `p`.
pub(crate) fn progress_joins() -> String {
    format!(
        "CROSS JOIN LATERAL (
              SELECT COALESCE(bool_or(g.consumer_group = '{QUEUE_MODE}'), false) AS has_queue_mode,
                     COALESCE(max(g.consumed_below)
                                  FILTER (WHERE g.consumer_group = '{QUEUE_MODE}'), 0)::int8
                         AS queue_consumed,
                     COALESCE(array_agg(g.consumer_group::text ORDER BY g.consumer_group)
                                  FILTER (WHERE g.consumer_group <> '{QUEUE_MODE}'),
                              '{{}}')::text[] AS bus_groups,
                     COALESCE(array_agg(g.consumed_below ORDER BY g.consumer_group)
                                  FILTER (WHERE g.consumer_group <> '{QUEUE_MODE}'),
                              '{{}}')::int8[] AS bus_consumed
                FROM queen.partition_group_progress g
               WHERE g.partition_id = p.id
         ) gp
         LEFT JOIN queen.partition_consumers ql
           ON ql.partition_id = p.id
          AND ql.consumer_group = '{QUEUE_MODE}'
          AND ql.lease_expires_at > now()"
    )
}

/// The consumer state of these partitions, in no particular order.
///
/// # Errors
///
/// Any database error.
pub async fn of_partitions(
    conn: &mut PgConnection,
    partition_ids: &[i64],
) -> Result<Vec<(i64, Progress)>, StorageError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: i64,
        #[sqlx(flatten)]
        progress: Progress,
    }
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT p.id, {PROGRESS_COLUMNS}
           FROM queen.partitions p
           {joins}
          WHERE p.id = ANY($1)",
        joins = progress_joins()
    ))
    .bind(partition_ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.progress)).collect())
}

/// Per partition, the dead letters among offsets `first .. next` bucketed by the partition's
/// completed and processing ranges. Partitions without any are left out.
///
/// # Errors
///
/// Any database error.
pub async fn dead_counts(
    conn: &mut PgConnection,
    ranges: &[(i64, Range<i64>, &Progress)],
) -> Result<Vec<(i64, DeadCounts)>, StorageError> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let mut cols: [Vec<i64>; 6] = Default::default();
    for (pid, range, progress) in ranges {
        let processing = progress.processing();
        for (col, v) in cols.iter_mut().zip([
            *pid,
            range.start,
            range.end,
            progress.completed_below(),
            processing.start,
            processing.end,
        ]) {
            col.push(v);
        }
    }
    let rows: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT x.pid,
                count(DISTINCT d.msg_offset),
                count(DISTINCT d.msg_offset) FILTER (WHERE d.msg_offset < x.done),
                count(DISTINCT d.msg_offset)
                    FILTER (WHERE d.msg_offset >= x.proc_from AND d.msg_offset < x.proc_to)
           FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[])
                AS x(pid, first, next, done, proc_from, proc_to)
           JOIN queen.dead_letters d
             ON d.partition_id = x.pid AND d.msg_offset >= x.first AND d.msg_offset < x.next
          GROUP BY x.pid",
    )
    .bind(&cols[0])
    .bind(&cols[1])
    .bind(&cols[2])
    .bind(&cols[3])
    .bind(&cols[4])
    .bind(&cols[5])
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(pid, total, completed, processing)| {
            (
                pid,
                DeadCounts {
                    total,
                    completed,
                    processing,
                },
            )
        })
        .collect())
}

/// The dead-lettered offsets inside these (partition, offset range) pairs, as (partition,
/// offset) pairs.
///
/// # Errors
///
/// Any database error.
pub async fn dead_offsets(
    conn: &mut PgConnection,
    ranges: &[(i64, Range<i64>)],
) -> Result<Vec<(i64, i64)>, StorageError> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let pids: Vec<i64> = ranges.iter().map(|r| r.0).collect();
    let starts: Vec<i64> = ranges.iter().map(|r| r.1.start).collect();
    let ends: Vec<i64> = ranges.iter().map(|r| r.1.end).collect();
    sqlx::query_as(
        "SELECT DISTINCT d.partition_id, d.msg_offset
           FROM unnest($1::int8[], $2::int8[], $3::int8[]) AS x(pid, first, next)
           JOIN queen.dead_letters d
             ON d.partition_id = x.pid AND d.msg_offset >= x.first AND d.msg_offset < x.next",
    )
    .bind(&pids)
    .bind(&starts)
    .bind(&ends)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// One group of a partition, as the message detail shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupProgress {
    /// Group name (`__QUEUE_MODE__` for queue mode).
    pub consumer_group: String,
    /// Everything below this is consumed by the group.
    pub consumed_below: i64,
    /// The group's live lease on the partition, if any.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// Every group of a partition, by name.
///
/// # Errors
///
/// Any database error.
pub async fn groups_of(
    conn: &mut PgConnection,
    partition_id: i64,
) -> Result<Vec<GroupProgress>, StorageError> {
    sqlx::query_as(
        "SELECT g.consumer_group, g.consumed_below, c.lease_expires_at
           FROM queen.partition_group_progress g
           LEFT JOIN queen.partition_consumers c
             ON c.partition_id = g.partition_id
            AND c.consumer_group = g.consumer_group
            AND c.lease_expires_at > now()
          WHERE g.partition_id = $1
          ORDER BY g.consumer_group",
    )
    .bind(partition_id)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// Why and after how many retries a message was dead-lettered (the latest, when several
/// groups gave up on it).
///
/// # Errors
///
/// Any database error.
pub async fn dead_letter_of(
    conn: &mut PgConnection,
    partition_id: i64,
    offset: i64,
) -> Result<Option<(Option<String>, i32)>, StorageError> {
    sqlx::query_as(
        "SELECT error_message, retry_count
           FROM queen.dead_letters
          WHERE partition_id = $1 AND msg_offset = $2
          ORDER BY failed_at DESC, id DESC
          LIMIT 1",
    )
    .bind(partition_id)
    .bind(offset)
    .fetch_optional(conn)
    .await
    .map_err(StorageError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(committed: i64, lease: Option<(i64, i64)>) -> Progress {
        Progress {
            has_queue_mode: true,
            queue_consumed: committed,
            lease_from: lease.map(|l| l.0),
            lease_to: lease.map(|l| l.1),
            ..Progress::default()
        }
    }

    #[test]
    fn queue_mode_statuses_come_from_the_cursor_and_the_live_lease() {
        // Cursor at 3, lease over 2..6 with 2 already acked.
        let p = queue(3, Some((2, 6)));
        let statuses: Vec<&str> = (0..8).map(|o| p.status(o, false).as_str()).collect();
        assert_eq!(
            statuses,
            [
                "completed",
                "completed",
                "completed",
                "processing",
                "processing",
                "processing",
                "pending",
                "pending"
            ]
        );
        assert_eq!(p.status(7, true), MessageStatus::DeadLetter);
        assert_eq!(p.mode(), Mode::Queue);
        assert_eq!(Progress::default().status(0, false), MessageStatus::Pending);
        assert_eq!(Progress::default().mode(), Mode::None);
    }

    #[test]
    fn bus_mode_is_completed_once_every_group_consumed() {
        let p = Progress {
            bus_groups: vec!["a".into(), "b".into()],
            bus_consumed: vec![4, 2],
            ..Progress::default()
        };
        assert_eq!(p.mode(), Mode::Bus);
        assert_eq!(p.status(1, false), MessageStatus::Completed);
        assert_eq!(p.status(2, false), MessageStatus::Pending);
        assert_eq!(p.queue_status(1, false), MessageStatus::Pending);
        assert_eq!(p.consumed_by(1), 2);
        assert_eq!(p.consumed_by(3), 1);
        assert_eq!(p.consumed_by(4), 0);
        assert!(p.processing().is_empty());
        // Hybrid: queue mode decides the status, the groups only show in busStatus.
        let h = Progress {
            has_queue_mode: true,
            queue_consumed: 1,
            bus_groups: vec!["g".into()],
            bus_consumed: vec![5],
            ..Progress::default()
        };
        assert_eq!(h.mode(), Mode::Hybrid);
        assert_eq!(h.status(2, false), MessageStatus::Pending);
        assert_eq!(h.consumed_by(2), 1);
    }

    #[test]
    fn tallies_split_the_stored_range_and_take_dead_letters_out() {
        let p = queue(3, Some((2, 6)));
        // Stored 1..8 (offset 0 removed by retention).
        let none = p.tally(1..8, &DeadCounts::default());
        assert_eq!(
            none,
            StatusCounts {
                pending: 2,
                processing: 3,
                completed: 2,
                dead_letter: 0
            }
        );
        // Offsets 1 (completed range) and 6 (pending range) dead-lettered.
        let dead = DeadCounts {
            total: 2,
            completed: 1,
            processing: 0,
        };
        assert_eq!(
            p.tally(1..8, &dead),
            StatusCounts {
                pending: 1,
                processing: 3,
                completed: 1,
                dead_letter: 2
            }
        );
        // A cursor behind the stored range (retention by age removed unconsumed messages).
        assert_eq!(
            queue(0, None).tally(5..7, &DeadCounts::default()).pending,
            2
        );
        assert_eq!(
            queue(9, None).tally(5..7, &DeadCounts::default()).completed,
            2
        );
    }

    #[test]
    fn status_names_round_trip() {
        for s in ["pending", "processing", "completed", "dead_letter"] {
            assert_eq!(MessageStatus::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(MessageStatus::parse("failed"), None);
    }
}
