//! The one "is PostgreSQL away?" rule (`StorageError::is_unreachable`) against real errors from
//! a real PostgreSQL: connection refused, a backend terminated by an administrator, a cluster
//! stopped with a fast shutdown, a statement timeout, a write on a read-only host (SQLSTATE
//! 25006, as during a primary switchover), and statements that simply fail. Each
//! case also checks the two places that act on the answer: the commit path
//! (`storage::push::commit::classify`: unreachable → the actors spool) and the HTTP edge
//! (`ApiError::Database`: unreachable → 503, else 500).

use std::time::Duration;

use actix_web::ResponseError;
use broker_actors::error::StoreError;
use queen_broker::http::error::ApiError;
use queen_broker::pg::{free_port, PrivateCluster};
use queen_broker::storage::{cluster::system, push::commit, StorageError};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// Asserts the classification of `e`, and what the HTTP edge answers for it.
fn assert_classified(e: StorageError, unreachable: bool) {
    let text = e.to_string();
    assert_eq!(
        e.is_unreachable(),
        unreachable,
        "{text} (SQLSTATE {:?})",
        e.sqlstate()
    );
    let status = ApiError::Database(e).status_code();
    assert_eq!(
        status.as_u16(),
        if unreachable { 503 } else { 500 },
        "{text} at the HTTP edge"
    );
}

/// Runs `sql` on `conn` and returns the error it must fail with.
async fn failing(conn: &mut PgConnection, sql: &str) -> StorageError {
    match sqlx::query(sql).execute(&mut *conn).await {
        Ok(_) => panic!("{sql} was expected to fail"),
        Err(e) => StorageError::from(e),
    }
}

/// The backend pid of `conn`.
async fn backend_pid(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .expect("pid")
}

/// Waits until backend `pid` is running a statement (the caller started one).
async fn wait_until_busy(admin: &mut PgConnection, pid: i32) {
    for _ in 0..500 {
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_optional(&mut *admin)
                .await
                .expect("pg_stat_activity")
                .flatten();
        if state.as_deref() == Some("active") {
            return;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} never became active");
}

#[actix_web::test]
async fn connection_refused_is_unreachable() {
    // A port nobody listens on (bound, read, released).
    let port = free_port().expect("a free port");
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let e = PgConnection::connect(&url)
        .await
        .expect_err("nothing listens there");
    assert!(matches!(e, sqlx::Error::Io(_)), "{e:?}");
    assert_classified(StorageError::from(e), true);

    // Through a pool and a storage function, as the broker meets it.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy(&url)
        .expect("lazy pool");
    let e = system::round_trip(&pool)
        .await
        .expect_err("nothing listens there");
    assert_classified(e, true);

    // A committer's store: spools.
    let e = system::round_trip(&pool).await.expect_err("still nothing");
    assert!(matches!(commit::classify(e), StoreError::Unavailable(_)));
}

#[actix_web::test]
async fn a_connection_closed_before_any_answer_is_unreachable() {
    // A listener that accepts and closes at once: a server going down, or a proxy in front of
    // PostgreSQL without a backend. The first thing the client reads is the end of the stream
    // (sqlx, built with TLS, meets it as the answer to its SSLRequest).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let closer = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let e = PgConnection::connect(&url)
        .await
        .expect_err("the peer closes at once");
    assert_classified(StorageError::from(e), true);

    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy(&url)
        .expect("lazy pool");
    let e = system::round_trip(&pool).await.expect_err("closed at once");
    assert!(matches!(commit::classify(e), StoreError::Unavailable(_)));
    closer.abort();
}

#[actix_web::test]
async fn a_statement_timeout_is_unreachable() {
    let db = crate::support::fresh_db().await;
    let mut conn = db.conn().await;
    sqlx::query("SET statement_timeout = 1")
        .execute(&mut conn)
        .await
        .expect("set");
    let e = failing(&mut conn, "SELECT pg_sleep(1)").await;
    assert_eq!(e.sqlstate().as_deref(), Some("57014"));
    assert_classified(e, true);
    let e = failing(&mut conn, "SELECT pg_sleep(1)").await;
    assert!(matches!(commit::classify(e), StoreError::Unavailable(_)));
    // The connection itself is fine afterwards.
    assert!(system::round_trip(&mut conn).await.expect("round trip"));
}

#[actix_web::test]
async fn a_write_on_a_read_only_host_is_unreachable_not_refused() {
    // What a primary made read-only (or a standby) answers during a switchover: SQLSTATE
    // 25006. The pushes must be spooled and replayed on the new primary, never quarantined.
    let db = crate::support::fresh_db().await;
    let mut conn = db.conn().await;
    sqlx::query("SET default_transaction_read_only = on")
        .execute(&mut conn)
        .await
        .expect("set");
    let e = failing(&mut conn, "CREATE TABLE queen.never (x int)").await;
    assert_eq!(e.sqlstate().as_deref(), Some("25006"));
    assert!(!e.is_refused_value(), "the data is not at fault");
    assert_classified(e, true);
    let e = failing(
        &mut conn,
        "SELECT id FROM queen.partitions ORDER BY id FOR UPDATE",
    )
    .await;
    assert!(matches!(commit::classify(e), StoreError::Unavailable(_)));
}

#[actix_web::test]
async fn a_backend_terminated_mid_statement_is_unreachable() {
    let db = crate::support::fresh_db().await;
    let mut admin = db.conn().await;
    let mut conn = db.conn().await;
    let pid = backend_pid(&mut conn).await;
    let sleeping = tokio::spawn(async move {
        let e = failing(&mut conn, "SELECT pg_sleep(30)").await;
        // The session is gone: the next statement fails too, without a SQLSTATE.
        let next = system::round_trip(&mut conn)
            .await
            .expect_err("terminated session");
        (e, next)
    });
    wait_until_busy(&mut admin, pid).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(terminated);
    let (e, next) = sleeping.await.expect("task");
    assert_eq!(e.sqlstate().as_deref(), Some("57P01"), "{e}");
    assert_classified(e, true);
    assert_classified(next, true);
}

#[actix_web::test]
async fn an_idle_backend_terminated_is_unreachable_on_next_use() {
    let db = crate::support::fresh_db().await;
    let mut admin = db.conn().await;
    let mut conn = db.conn().await;
    let pid = backend_pid(&mut conn).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut admin)
        .await
        .expect("terminate");
    // Wait for the backend to be gone, so the next statement meets a closed session.
    for _ in 0..500 {
        let alive: bool =
            sqlx::query_scalar("SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_one(&mut admin)
                .await
                .expect("pg_stat_activity");
        if !alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let e = system::flag(&mut conn, system::MAINTENANCE)
        .await
        .expect_err("terminated session");
    assert_classified(e, true);
}

struct Cleanup(PrivateCluster, std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.0.stop(true);
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

#[actix_web::test]
async fn an_administrator_shutdown_is_unreachable() {
    let dir = std::env::temp_dir().join(format!("queen-errors-{}", Uuid::new_v4().simple()));
    let cluster =
        PrivateCluster::new(&dir.join("pg"), free_port().expect("port")).expect("server binaries");
    cluster.start(false).expect("cluster starts");
    let _cleanup = Cleanup(cluster.clone(), dir);
    let url = cluster.url("postgres");
    let mut admin = PgConnection::connect(&url).await.expect("admin");
    let mut conn = PgConnection::connect(&url).await.expect("connection");
    let pid = backend_pid(&mut conn).await;
    let sleeping = tokio::spawn(async move { failing(&mut conn, "SELECT pg_sleep(30)").await });
    wait_until_busy(&mut admin, pid).await;
    let stopping = cluster.clone();
    tokio::task::spawn_blocking(move || stopping.stop(false))
        .await
        .expect("task")
        .expect("fast stop");
    let e = sleeping.await.expect("task");
    assert_eq!(e.sqlstate().as_deref(), Some("57P01"), "{e}");
    assert_classified(e, true);

    // The stopped cluster refuses connections.
    let e = PgConnection::connect(&url)
        .await
        .expect_err("the cluster is stopped");
    assert_classified(StorageError::from(e), true);
}

#[actix_web::test]
async fn statements_that_fail_are_not_unreachable() {
    let db = crate::support::fresh_db().await;
    let mut conn = db.conn().await;
    let e = failing(&mut conn, "SELEKT 1").await;
    assert_eq!(e.sqlstate().as_deref(), Some("42601"));
    assert_classified(e, false);
    let e = failing(&mut conn, "SELECT 1 / 0").await;
    assert_eq!(e.sqlstate().as_deref(), Some("22012"));
    assert_classified(e, false);
    // A data exception is the data's fault: refused (quarantined by replay when alone).
    let e = failing(&mut conn, "SELECT 1 / 0").await;
    assert!(matches!(commit::classify(e), StoreError::Refused(_)));
    let e = failing(&mut conn, "SELECT E'a\\x00b'::text").await;
    assert_eq!(e.sqlstate().as_deref(), Some("22021"));
    assert!(matches!(commit::classify(e), StoreError::Refused(_)));
    // A statement that is wrong is not the data's fault: the transaction failed.
    let e = failing(&mut conn, "SELEKT 1").await;
    assert!(matches!(commit::classify(e), StoreError::Transaction(_)));

    // A lock timeout: someone else holds the row, we give up waiting. Not an outage.
    let mut holder = db.conn().await;
    let mut tx = holder.begin().await.expect("begin");
    sqlx::query("LOCK TABLE queen.partitions IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    sqlx::query("SET lock_timeout = 10")
        .execute(&mut conn)
        .await
        .expect("set");
    let e = failing(&mut conn, "SELECT count(*) FROM queen.partitions").await;
    assert_eq!(e.sqlstate().as_deref(), Some("55P03"));
    assert!(
        !e.is_refused_value(),
        "a lock timeout is not the data's fault"
    );
    assert_classified(e, false);
    tx.rollback().await.expect("rollback");

    // A domain fault: a stored segment that does not decode.
    let corrupt = queen_broker::storage::segments::frames::decode(&[0xff])
        .map_err(|source| StorageError::CorruptSegment {
            partition: 7,
            source,
        })
        .expect_err("not a segment");
    assert!(
        corrupt.to_string().starts_with("partition 7: "),
        "{corrupt}"
    );
    assert_classified(corrupt, false);
}
