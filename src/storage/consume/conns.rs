//! Connections held the way the consume path uses them.
//!
//! sqlx answers every connection returned to its pool with a round trip to PostgreSQL (a
//! `Sync`, to learn that the connection is still usable), and a pool that tests before
//! acquiring (the shared one) adds another on the way out. On the consume path that was one
//! to three round trips per pop and per grouped statement, each waking a backend on a machine
//! whose cores PostgreSQL and the broker share. So:
//! - a pop takes its connection only when it runs a statement ([`LazyConn`]): a pop served by
//!   a lease claimed ahead, or by a hand-off claimed in a group, touches no pool at all;
//! - a statement group's worker keeps its connection from one statement to the next
//!   ([`KeptConn`]), giving it back once every [`KEEP_FOR`] (so a switch of primary, which the
//!   pools apply when they hand a connection out, reaches the worker within that time) and
//!   when it has had nothing to do for [`IDLE_GIVE_BACK`] (so an idle broker holds no
//!   connection of the shared pool), and dropping it after a failed statement.

use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

/// A connection taken from `pool` at its first use, or one the caller already holds.
pub enum LazyConn<'c> {
    /// Acquired from the pool on first use (and returned when dropped).
    Pool {
        /// Where it comes from.
        pool: &'c PgPool,
        /// The connection, once acquired.
        conn: Option<PoolConnection<Postgres>>,
    },
    /// A connection the caller holds.
    Held(&'c mut PgConnection),
}

impl<'c> LazyConn<'c> {
    /// A connection of `pool`, not acquired yet.
    pub fn new(pool: &'c PgPool) -> Self {
        Self::Pool { pool, conn: None }
    }

    /// The connection, acquired now if it was not yet.
    ///
    /// # Errors
    ///
    /// The pool's error when no connection can be had.
    pub async fn get(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        match self {
            Self::Held(conn) => Ok(&mut **conn),
            Self::Pool { pool, conn } => {
                let taken = match conn.take() {
                    Some(c) => c,
                    None => pool.acquire().await?,
                };
                Ok(&mut **conn.insert(taken))
            }
        }
    }
}

/// How long a worker keeps one connection before giving it back and taking another.
pub const KEEP_FOR: Duration = Duration::from_secs(1);

/// How long a worker waits for work before it gives its connection back.
pub const IDLE_GIVE_BACK: Duration = Duration::from_millis(100);

/// A statement group worker's connection, kept between its statements.
pub struct KeptConn {
    pool: PgPool,
    conn: Option<(PoolConnection<Postgres>, Instant)>,
}

impl KeptConn {
    /// Connections of `pool`, none taken yet.
    pub fn new(pool: PgPool) -> Self {
        Self { pool, conn: None }
    }

    /// The kept connection; a new one when none is kept or the kept one is older than
    /// [`KEEP_FOR`].
    ///
    /// # Errors
    ///
    /// The pool's error when no connection can be had.
    pub async fn get(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        if self
            .conn
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= KEEP_FOR)
        {
            // Given back before another is asked for (a pool as small as its workers would
            // otherwise wait for it), so the pool's checks on handing one out apply again.
            self.conn = None;
        }
        let kept = match self.conn.take() {
            Some(kept) => kept,
            None => (self.pool.acquire().await?, Instant::now()),
        };
        Ok(&mut *self.conn.insert(kept).0)
    }

    /// Gives the kept connection back to the pool (a worker with nothing to do).
    pub fn give_back(&mut self) {
        self.conn = None;
    }

    /// After a failed statement: the kept connection is closed rather than used again or
    /// returned (it may be broken); the next [`KeptConn::get`] takes another.
    pub fn discard(&mut self) {
        if let Some((mut c, _)) = self.conn.take() {
            c.close_on_drop();
        }
    }
}
