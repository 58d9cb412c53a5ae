//! What the statement groups share ([`crate::storage::consume::ack_group`] for acks,
//! [`crate::storage::consume::claim_group`] for hand-off claims): requests wait in a channel with a
//! reply slot each, a free worker takes the first and every other one waiting with it, and a
//! group never holds two requests for the same (partition, group) row (one statement updates a
//! row once).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};

use crate::storage::consume::conns::{KeptConn, IDLE_GIVE_BACK};

/// A request for a statement group, with the slot its answer goes to.
pub type Job<J, R> = (J, oneshot::Sender<R>);

/// The waiting requests, shared by the workers of one group.
pub type Queue<J, R> = Arc<Mutex<mpsc::UnboundedReceiver<Job<J, R>>>>;

/// A request that updates one (partition, group) row.
pub trait RowKey {
    /// The row: partition database id and consumer group.
    fn row(&self) -> (i64, &str);
}

/// Waits for the first request, then takes every other one already waiting, up to `max`;
/// `None` when every sender is gone.
pub async fn next_group<J, R>(queue: &Queue<J, R>, max: usize) -> Option<Vec<Job<J, R>>> {
    let mut queue = queue.lock().await;
    let mut group = vec![queue.recv().await?];
    while group.len() < max {
        match queue.try_recv() {
            Ok(job) => group.push(job),
            Err(_) => break,
        }
    }
    Some(group)
}

/// [`next_group`] for a worker keeping `conn`: gives the connection back when no request came
/// for [`IDLE_GIVE_BACK`].
pub async fn next_group_keeping<J, R>(
    queue: &Queue<J, R>,
    max: usize,
    conn: &mut KeptConn,
) -> Option<Vec<Job<J, R>>> {
    // Cancelling `next_group` loses nothing: it waits only on the lock and on `recv`.
    match tokio::time::timeout(IDLE_GIVE_BACK, next_group(queue, max)).await {
        Ok(group) => group,
        Err(_) => {
            conn.give_back();
            next_group(queue, max).await
        }
    }
}

/// Sorts `group` by row (the order every transaction locks rows in) and keeps the first request
/// of each row; the later ones are answered `duplicate()` at once. The kept requests and their
/// reply slots, in the same order.
pub fn one_per_row<J: RowKey, R>(
    mut group: Vec<Job<J, R>>,
    duplicate: impl Fn() -> R,
) -> (Vec<J>, Vec<oneshot::Sender<R>>) {
    group.sort_by(|(a, _), (b, _)| a.row().cmp(&b.row()));
    let mut kept: Vec<J> = Vec::with_capacity(group.len());
    let mut replies = Vec::with_capacity(group.len());
    for (job, reply) in group {
        // Sorted, so a second request for the same row follows the first.
        if kept.last().is_some_and(|k| k.row() == job.row()) {
            let _ = reply.send(duplicate());
        } else {
            kept.push(job);
            replies.push(reply);
        }
    }
    (kept, replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Req(i64, &'static str);

    impl RowKey for Req {
        fn row(&self) -> (i64, &str) {
            (self.0, self.1)
        }
    }

    #[test]
    fn a_row_is_kept_once_and_its_twins_answered_at_once() {
        let mut answers = Vec::new();
        let group: Vec<Job<Req, &str>> = [Req(2, "g"), Req(1, "g"), Req(2, "g"), Req(2, "h")]
            .into_iter()
            .map(|r| {
                let (tx, rx) = oneshot::channel();
                answers.push(rx);
                (r, tx)
            })
            .collect();
        let (kept, replies) = one_per_row(group, || "twin");
        let rows: Vec<(i64, &str)> = kept.iter().map(RowKey::row).collect();
        assert_eq!(rows, vec![(1, "g"), (2, "g"), (2, "h")]);
        assert_eq!(replies.len(), 3);
        // The third request (a twin of the first) was answered; the others wait.
        assert_eq!(answers[2].try_recv(), Ok("twin"));
        assert!(answers[0].try_recv().is_err());
    }

    #[actix_web::test]
    async fn a_worker_takes_every_request_waiting_up_to_the_limit() {
        let (tx, rx) = mpsc::unbounded_channel::<Job<Req, ()>>();
        let queue: Queue<Req, ()> = Arc::new(Mutex::new(rx));
        for i in 0..5 {
            tx.send((Req(i, "g"), oneshot::channel().0)).expect("open");
        }
        assert_eq!(next_group(&queue, 3).await.map(|g| g.len()), Some(3));
        assert_eq!(next_group(&queue, 3).await.map(|g| g.len()), Some(2));
        drop(tx);
        assert!(next_group(&queue, 3).await.is_none());
    }
}
