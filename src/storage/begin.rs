//! Transactions PostgreSQL ends by itself when their client goes quiet mid-way.
//!
//! A transaction of several round trips holds its row locks between them (a timer's claim,
//! a lock's row, a KV batch, a partition's row in a rider transaction). If the broker's link
//! to PostgreSQL goes half-open in the middle (a vanished NAT entry, a hung proxy: nothing
//! reset, nothing answered), the broker gives the connection up, but the server's backend
//! sits idle in the transaction, its locks held, until TCP tells it, which can take hours.
//! Every broker then skips or waits on those rows: in the chaos run with half-open links,
//! 691 due timers stayed unfired for good behind one frozen timer round. [`begin`] opens the
//! transaction with `idle_in_transaction_session_timeout` set for it alone, so the server
//! ends such a transaction after [`IDLE_IN_TRANSACTION`] and frees its locks. A transaction
//! sent in one round trip (the commit path's `BEGIN; …` statements) never idles and needs none.

use std::time::Duration;

use sqlx::{PgConnection, Postgres, Transaction};

/// Longest a transaction opened by [`begin`] may sit idle between two statements. Ours run
/// their statements back to back; a gap this long means the broker is gone or cut off.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// `BEGIN` with the idle bound, in one round trip.
const BEGIN_BOUNDED: &str = "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '10s'";

/// Opens a transaction on `conn` bounded by [`IDLE_IN_TRANSACTION`]; inside a transaction
/// already, a savepoint (the outer transaction carries the bound).
///
/// # Errors
///
/// Any database error.
pub async fn begin(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    if sqlx::Connection::is_in_transaction(conn) {
        sqlx::Connection::begin(conn).await
    } else {
        sqlx::Connection::begin_with(conn, BEGIN_BOUNDED).await
    }
}
