//! A PostgreSQL primary with a streaming standby, both throwaway clusters on loopback made by
//! the test (`pg_basebackup -R` from the primary), and the steps of a switchover: the old
//! primary made read-only, the standby caught up and promoted, the old primary stopped; or a
//! failover: the primary crashes and the standby is promoted with what it has. Replication is
//! asynchronous unless [`ReplicaPair::make_synchronous`] is called. Both are durable (fsync
//! on): what a broker answered `queued` is on disk.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use queen_broker::pg::{free_port, PrivateCluster};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// A primary and its standby; both stopped and removed when dropped.
pub struct ReplicaPair {
    /// The primary (until the switchover).
    pub primary: PrivateCluster,
    /// Its streaming standby (the primary after the switchover).
    pub standby: PrivateCluster,
    dir: PathBuf,
}

impl ReplicaPair {
    /// Starts a primary, takes a base backup of it and starts the standby from it.
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("queen-replica-{}", Uuid::new_v4().simple()));
        let primary = PrivateCluster::new(&dir.join("primary"), free_port().expect("port"))
            .expect("server binaries");
        primary.start(true).expect("primary starts");
        let standby = PrivateCluster::new(&dir.join("standby"), free_port().expect("port"))
            .expect("server binaries");
        let pair = Self {
            primary,
            standby,
            dir,
        };
        pair.standby
            .base_backup_of(&pair.primary)
            .expect("pg_basebackup from the primary");
        pair.standby.start(true).expect("standby starts");
        pair
    }

    /// The multi-host URL of database `db`: primary first, then the standby.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// The same URL with the standby listed first.
    pub fn url_standby_first(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
            self.standby.port, self.primary.port
        )
    }

    /// Waits until the standby has replayed everything the primary has written (bounded).
    pub async fn standby_caught_up(&self) {
        let mut primary = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .expect("primary answers");
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(&mut primary)
            .await
            .expect("primary LSN");
        let mut standby = PgConnection::connect(&self.standby.url("postgres"))
            .await
            .expect("standby answers");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let caught_up: bool = sqlx::query_scalar(
                "SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)",
            )
            .bind(&lsn)
            .fetch_one(&mut standby)
            .await
            .expect("standby replay LSN");
            if caught_up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby did not replay up to {lsn} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Turns replication synchronous (`synchronous_standby_names = '*'`, `synchronous_commit`
    /// stays `on`: a commit returns once the standby has flushed it) and waits until the
    /// primary reports its standby as `sync` (bounded).
    pub async fn make_synchronous(&self) {
        self.set_on_primary("synchronous_standby_names", "'*'")
            .await;
        self.one_standby_where("sync_state = 'sync'", "become synchronous")
            .await;
    }

    /// Waits until the primary sees its standby streaming (bounded).
    pub async fn streaming(&self) {
        self.one_standby_where("state = 'streaming'", "stream")
            .await;
    }

    /// `ALTER SYSTEM SET name = value` on the primary, then a reload.
    async fn set_on_primary(&self, name: &str, value: &str) {
        let mut conn = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .expect("primary answers");
        sqlx::query(&format!("ALTER SYSTEM SET {name} = {value}"))
            .execute(&mut conn)
            .await
            .expect("ALTER SYSTEM");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await
            .expect("reload");
    }

    /// Waits (30 s at most) until `pg_stat_replication` on the primary shows one standby
    /// matching `condition`; `what` names it in the failure.
    async fn one_standby_where(&self, condition: &str, what: &str) {
        let mut conn = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .expect("primary answers");
        one_standby(&mut conn, condition, what, Duration::from_secs(30)).await;
    }

    /// The first step of a controlled switchover: the primary stops taking writes. New
    /// transactions are read-only (`default_transaction_read_only`, so writes fail with
    /// SQLSTATE 25006) and every client session is ended (so no read-write transaction that
    /// started before goes on).
    pub async fn make_primary_read_only(&self) {
        self.set_on_primary("default_transaction_read_only", "on")
            .await;
        let mut conn = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .expect("primary answers");
        // The reload reaches the postmaster and every session asynchronously: give it a moment,
        // so every session started after the terminations below is read-only.
        tokio::time::sleep(Duration::from_millis(200)).await;
        sqlx::query(
            "SELECT pg_terminate_backend(pid)
               FROM pg_stat_activity
              WHERE backend_type = 'client backend'
                AND pid <> pg_backend_pid()",
        )
        .execute(&mut conn)
        .await
        .expect("terminate client sessions");
    }
}

impl Drop for ReplicaPair {
    fn drop(&mut self) {
        let _ = self.standby.stop(true);
        let _ = self.primary.stop(true);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (`within` at most) until `pg_stat_replication`, read on `primary`, shows exactly one
/// standby matching `condition`; `what` names it in the failure.
pub async fn one_standby(
    primary: &mut PgConnection,
    condition: &str,
    what: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM pg_stat_replication WHERE {condition}"
        ))
        .fetch_one(&mut *primary)
        .await
        .expect("pg_stat_replication");
        if n == 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the standby did not {what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
