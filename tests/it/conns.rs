//! How the consume path holds its connections (`storage::consume::conns`): a pop's connection is taken
//! from the pool only when a statement needs it, and a statement group's worker keeps one
//! connection from statement to statement instead of giving it back (each give-back is a round
//! trip to PostgreSQL), until a statement fails.

use queen_broker::storage::consume::conns::{KeptConn, LazyConn, KEEP_FOR};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

use crate::support::{fresh_db, TestDb};

fn lazy_pool(db: &TestDb, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .connect_lazy(&db.url)
        .expect("pool")
}

async fn backend_pid(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .expect("pid")
}

#[actix_web::test]
async fn a_lazy_connection_is_taken_from_the_pool_at_its_first_use_and_kept_for_the_next() {
    let db = fresh_db().await;
    let pool = lazy_pool(&db, 2);
    let mut conn = LazyConn::new(&pool);
    // Made, not used: nothing is taken.
    assert_eq!(pool.size(), 0);
    let first = backend_pid(conn.get().await.expect("connection")).await;
    assert_eq!(pool.size(), 1);
    assert_eq!(pool.num_idle(), 0, "in use while the pop holds it");
    // The same connection for the pop's next statement.
    let second = backend_pid(conn.get().await.expect("connection")).await;
    assert_eq!(first, second);
    assert_eq!(pool.size(), 1);
    drop(conn);
    // Dropped: back in the pool (the return runs in the background).
    crate::support::eventually(
        std::time::Duration::from_secs(5),
        "connection back in the pool",
        || async { (pool.num_idle() == 1).then_some(()) },
    )
    .await;
}

#[actix_web::test]
async fn a_lazy_connection_over_a_held_one_uses_it_without_the_pool() {
    let db = fresh_db().await;
    let mut held = db.conn().await;
    let pid = backend_pid(&mut held).await;
    let mut conn = LazyConn::Held(&mut held);
    assert_eq!(
        backend_pid(conn.get().await.expect("connection")).await,
        pid
    );
}

#[actix_web::test]
async fn a_worker_keeps_its_connection_between_statements_and_drops_it_after_a_failure() {
    let db = fresh_db().await;
    let pool = lazy_pool(&db, 1);
    let mut kept = KeptConn::new(pool.clone());
    let first = backend_pid(kept.get().await.expect("connection")).await;
    // Kept, not given back: the pool has nothing idle, and the next statement runs on the
    // same backend.
    assert_eq!(pool.num_idle(), 0);
    assert_eq!(
        backend_pid(kept.get().await.expect("connection")).await,
        first
    );
    assert_eq!(pool.size(), 1);
    // Given back (a worker with nothing to do): idle in the pool, and taken again on demand.
    kept.give_back();
    crate::support::eventually(
        std::time::Duration::from_secs(5),
        "connection back in the pool",
        || async { (pool.num_idle() == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        backend_pid(kept.get().await.expect("connection")).await,
        first
    );
    // A failed statement: the worker discards the connection; the next one is another backend.
    let failed = sqlx::query("SELECT 1/0")
        .execute(kept.get().await.expect("connection"))
        .await;
    assert!(failed.is_err());
    kept.discard();
    let next = backend_pid(kept.get().await.expect("connection")).await;
    assert_ne!(
        next, first,
        "the discarded connection was closed, not reused"
    );
    // The discarded backend is gone from the server.
    let mut admin = db.conn().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(first)
                .fetch_one(&mut admin)
                .await
                .expect("reads");
        if !alive {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the discarded backend {first} still runs"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[actix_web::test]
async fn a_worker_gives_its_connection_back_before_taking_another_even_from_a_pool_of_one() {
    let db = fresh_db().await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect_lazy(&db.url)
        .expect("pool");
    let mut kept = KeptConn::new(pool.clone());
    backend_pid(kept.get().await.expect("connection")).await;
    tokio::time::sleep(KEEP_FOR + std::time::Duration::from_millis(50)).await;
    // Kept past its time: given back and taken again. Holding it while asking the pool of one
    // for another would wait out the pool's timeout and fail.
    backend_pid(kept.get().await.expect("connection after KEEP_FOR")).await;
    assert_eq!(pool.size(), 1);
}
