//! A primary and a synchronous standby that fail over again and again, for the mixed chaos
//! run (`tests/it/chaos.rs`). Both are durable clusters on loopback made by the test; the
//! standby is a `pg_basebackup -R` of the primary. A failover: the primary crashes
//! (`pg_ctl stop -m immediate`), the standby is promoted at once with what it has (as an HA
//! engine promotes) and, having no standby left, stops waiting for one
//! (`synchronous_standby_names = ''`, as pg_auto_failover and Patroni's non-strict mode do);
//! then the crashed node is rewound onto the new timeline (`pg_rewind -R`; a fresh
//! `pg_basebackup` if the rewind fails) and started as the new primary's standby, and
//! replication is made synchronous again. The pair then fails over the other way.

use std::cell::Cell;
use std::path::Path;
use std::time::{Duration, Instant};

use queen_broker::pg::{free_port, PrivateCluster};
use sqlx::{Connection, PgConnection};

use super::replica::one_standby;

/// Settings of both nodes, set before the standby is made (so it has them too).
const SETTINGS: [(&str, &str); 5] = [
    // pg_rewind needs hint-bit changes in the WAL.
    ("wal_log_hints", "on"),
    // A fired timer's commit time by PostgreSQL's clock (the chaos run's timer check).
    ("track_commit_timestamp", "on"),
    // The rewound node streams what it missed from the new primary.
    ("wal_keep_size", "'8GB'"),
    // A standby whose primary restarted reconnects within this (default 5 s, during which a
    // synchronous primary's commits wait).
    ("wal_retrieve_retry_interval", "'200ms'"),
    ("synchronous_standby_names", "'*'"),
];

/// The pair; see the module docs. Both nodes are stopped when dropped (their folders are the
/// caller's).
pub struct HaPair {
    pub nodes: [PrivateCluster; 2],
    primary: Cell<usize>,
}

impl HaPair {
    /// Starts the primary in `dir/pg0`, its synchronous standby in `dir/pg1`.
    pub async fn start(dir: &Path) -> HaPair {
        let node = |n: usize| {
            PrivateCluster::new(&dir.join(format!("pg{n}")), free_port().expect("port"))
                .expect("server binaries")
        };
        let pair = HaPair {
            nodes: [node(0), node(1)],
            primary: Cell::new(0),
        };
        let first = &pair.nodes[0];
        first.start(true).expect("primary starts");
        let mut conn = connect(first).await;
        for (name, value) in SETTINGS {
            sqlx::query(&format!("ALTER SYSTEM SET {name} = {value}"))
                .execute(&mut conn)
                .await
                .expect("ALTER SYSTEM");
        }
        drop(conn);
        // wal_log_hints and track_commit_timestamp take a restart.
        first.stop(false).expect("primary stops");
        first.start(true).expect("primary starts again");
        pair.nodes[1]
            .base_backup_of(first)
            .expect("pg_basebackup from the primary");
        pair.nodes[1].start(true).expect("standby starts");
        pair.synchronous_again().await;
        pair
    }

    /// The node taking writes.
    pub fn primary(&self) -> &PrivateCluster {
        &self.nodes[self.primary.get()]
    }

    /// The URL of database `db` on the node taking writes.
    pub fn primary_url(&self, db: &str) -> String {
        self.primary().url(db)
    }

    /// The primary crashes and the standby is promoted. Returns once it takes writes without
    /// waiting for a standby; [`HaPair::rebuild_standby`] then makes the crashed node its
    /// standby. `crashed` is called right after the crash.
    pub async fn crash_and_promote(&self, crashed: impl FnOnce()) -> Duration {
        let old = self.primary.get();
        let new = 1 - old;
        let start = Instant::now();
        let (o, n) = (self.nodes[old].clone(), self.nodes[new].clone());
        off_thread(move || o.stop(true))
            .await
            .expect("pg_ctl stop -m immediate");
        crashed();
        off_thread(move || n.promote())
            .await
            .expect("pg_ctl promote");
        self.primary.set(new);
        let mut conn = connect(&self.nodes[new]).await;
        sqlx::query("ALTER SYSTEM SET synchronous_standby_names = ''")
            .execute(&mut conn)
            .await
            .expect("synchronous replication off");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await
            .expect("reload");
        start.elapsed()
    }

    /// The crashed former primary becomes the new primary's synchronous standby: rewound
    /// (`pg_rewind -R`), or copied afresh when the rewind fails; started; streaming; then
    /// replication synchronous again. Returns how long it took and whether it was a rewind.
    pub async fn rebuild_standby(&self) -> (Duration, bool) {
        let start = Instant::now();
        let primary = self.primary();
        let old = &self.nodes[1 - self.primary.get()];
        // pg_rewind reads the new timeline from the source's control file: a checkpoint after
        // the promotion writes it.
        let mut conn = connect(primary).await;
        sqlx::query("CHECKPOINT")
            .execute(&mut conn)
            .await
            .expect("checkpoint");
        drop(conn);
        // pg_rewind copies the source's data folder file by file and cannot read the Unix
        // socket the server keeps there; nothing here connects through it (TCP only), so it
        // goes (the server keeps listening on TCP).
        let _ = std::fs::remove_file(primary.data_dir.join(format!(".s.PGSQL.{}", primary.port)));
        let (old, source) = (old.clone(), primary.clone());
        let rewound = off_thread(move || {
            let rewound = match old.rewind_from(&source) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("ha_pair: pg_rewind failed ({e}); a fresh base backup instead");
                    remove_data(&old.data_dir);
                    old.base_backup_of(&source)
                        .expect("pg_basebackup from the new primary");
                    false
                }
            };
            old.start(true).expect("the new standby starts");
            rewound
        })
        .await;
        self.synchronous_again().await;
        (start.elapsed(), rewound)
    }

    /// Synchronous replication on the primary, once its standby streams; waits until
    /// `pg_stat_replication` shows it `sync` (bounded).
    async fn synchronous_again(&self) {
        let mut conn = connect(self.primary()).await;
        let within = Duration::from_secs(120);
        one_standby(&mut conn, "state = 'streaming'", "stream", within).await;
        sqlx::query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            .execute(&mut conn)
            .await
            .expect("synchronous replication on");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await
            .expect("reload");
        one_standby(
            &mut conn,
            "sync_state = 'sync'",
            "become synchronous",
            within,
        )
        .await;
    }

    /// Both nodes stopped (immediately: the test is over).
    pub fn stop(&self) {
        for node in &self.nodes {
            let _ = node.stop(true);
        }
    }
}

/// Runs a blocking step (a `pg_ctl` or `pg_rewind` call) on the blocking pool, so the test's
/// clients go on meanwhile.
pub async fn off_thread<T: Send + 'static>(step: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(step)
        .await
        .expect("blocking step ran")
}

/// Connects to `node` (retried for 30 s: it may be starting or finishing recovery).
async fn connect(node: &PrivateCluster) -> PgConnection {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match PgConnection::connect(&node.url("postgres")).await {
            Ok(conn) => return conn,
            Err(e) => {
                assert!(Instant::now() < deadline, "{}: {e}", node.port);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Empties a stopped node's data folder (kept, with its owner and mode).
fn remove_data(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}
