//! The PostgreSQL the bench runs on: a private durable cluster from the local binaries (default)
//! or a server given by URL. Every measurement gets a fresh database cloned from a template that
//! already holds the broker's schema, so table growth never carries over between scenarios.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use queen_broker::pg::PrivateCluster;
use sqlx::{Connection, PgConnection};

use crate::data;
use crate::BoxError;

/// The server and how to reach it.
pub struct Server {
    /// URL of the server's maintenance database (for CREATE/DROP DATABASE and CHECKPOINT).
    admin_url: String,
    /// An open admin connection.
    pub admin: PgConnection,
    /// The private cluster, when the bench started one.
    cluster: Option<PrivateCluster>,
    data_dir: Option<PathBuf>,
    /// The postmaster's pid, when the server runs on this machine.
    pub postmaster: Option<u32>,
    template: String,
    counter: u32,
    /// Server settings that decide durability and speed, as reported by the server.
    pub settings: Vec<(String, String)>,
}

fn base_url(url: &str) -> &str {
    url.rsplit_once('/').map_or(url, |(base, _)| base)
}

impl Server {
    /// Starts a private durable cluster (fsync on, synchronous_commit on) in a temp folder.
    ///
    /// # Errors
    ///
    /// When no server binaries are installed or the cluster does not start.
    pub async fn private() -> Result<Self, BoxError> {
        let dir =
            std::env::temp_dir().join(format!("queen-bench-pg-{}", uuid::Uuid::new_v4().simple()));
        let port = queen_broker::pg::free_port()?;
        let cluster = PrivateCluster::new(&dir, port)?;
        let starting = cluster.clone();
        tokio::task::spawn_blocking(move || starting.start(true)).await??;
        // Stop and remove the cluster when this process exits, however it exits.
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            stop = cluster.stop_command_line(),
            dir = dir.display()
        );
        Command::new("sh")
            .arg("-c")
            .arg(watchdog)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut server = Self::connect(&cluster.url("postgres")).await?;
        server.cluster = Some(cluster);
        server.data_dir = Some(dir);
        Ok(server)
    }

    /// Uses the server at `url` (its database is used for administration only).
    ///
    /// # Errors
    ///
    /// When the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, BoxError> {
        let mut admin = PgConnection::connect(url).await?;
        let postmaster = postmaster_of(&mut admin).await?;
        let mut settings = Vec::new();
        for name in [
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_level",
            "shared_buffers",
            "max_wal_size",
            "checkpoint_timeout",
            "max_connections",
        ] {
            let value: String = sqlx::query_scalar(&format!("SHOW {name}"))
                .fetch_one(&mut admin)
                .await?;
            settings.push((name.to_string(), value));
        }
        let template = format!("queen_bench_template_{}", std::process::id());
        Ok(Self {
            admin_url: url.to_string(),
            admin,
            cluster: None,
            data_dir: None,
            postmaster,
            template,
            counter: 0,
            settings,
        })
    }

    /// A setting as the server reported it.
    pub fn setting(&self, name: &str) -> &str {
        self.settings
            .iter()
            .find(|(n, _)| n == name)
            .map_or("?", |(_, v)| v.as_str())
    }

    /// Whether commits are durable (fsync on, synchronous_commit on).
    pub fn durable(&self) -> bool {
        self.setting("fsync") == "on" && self.setting("synchronous_commit") == "on"
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", base_url(&self.admin_url))
    }

    /// Creates the template: the broker's migrations, applied once.
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn prepare_template(&mut self) -> Result<(), BoxError> {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {}", self.template))
            .execute(&mut self.admin)
            .await?;
        sqlx::query(&format!("CREATE DATABASE {}", self.template))
            .execute(&mut self.admin)
            .await?;
        let mut conn = PgConnection::connect(&self.url(&self.template)).await?;
        queen_broker::storage::MIGRATOR.run(&mut conn).await?;
        conn.close().await?;
        Ok(())
    }

    /// A fresh database cloned from the template; returns its name.
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn create_database(&mut self) -> Result<String, BoxError> {
        self.counter += 1;
        let name = format!("queen_bench_{}_{}", std::process::id(), self.counter);
        sqlx::query(&format!(
            "CREATE DATABASE {name} TEMPLATE {}",
            self.template
        ))
        .execute(&mut self.admin)
        .await?;
        Ok(name)
    }

    /// Drops a database made by [`Server::create_database`] (after its clients left).
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn drop_database(&mut self, name: &str) -> Result<(), BoxError> {
        for attempt in 0.. {
            let done = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut self.admin)
                .await;
            match done {
                Ok(_) => break,
                Err(e) if attempt >= 20 => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(())
    }

    /// Flushes dirty buffers so every measurement starts from the same state.
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn checkpoint(&mut self) -> Result<(), BoxError> {
        sqlx::query("CHECKPOINT").execute(&mut self.admin).await?;
        Ok(())
    }

    /// The current WAL position and the server clock (both as text), for window boundaries.
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn mark(&mut self) -> Result<Mark, BoxError> {
        let (lsn, at): (String, String) =
            sqlx::query_as("SELECT pg_current_wal_lsn()::text, clock_timestamp()::text")
                .fetch_one(&mut self.admin)
                .await?;
        Ok(Mark { lsn, at })
    }

    /// WAL bytes written between two marks.
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn wal_bytes(&mut self, a: &Mark, b: &Mark) -> Result<f64, BoxError> {
        let bytes: f64 =
            sqlx::query_scalar("SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8")
                .bind(&a.lsn)
                .bind(&b.lsn)
                .fetch_one(&mut self.admin)
                .await?;
        Ok(bytes)
    }

    /// The URL of the maintenance database.
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// Loads pg_stat_statements: on a private cluster by restarting it with the library
    /// preloaded; on a given server only when it is already preloaded there.
    ///
    /// # Errors
    ///
    /// When the restart fails or the extension cannot be created.
    pub async fn enable_profiling(&mut self) -> Result<(), BoxError> {
        if let Some(cluster) = self.cluster.clone() {
            sqlx::query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                .execute(&mut self.admin)
                .await?;
            tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
                cluster.stop(false)?;
                cluster.start(true)?;
                Ok(())
            })
            .await??;
            self.admin = PgConnection::connect(&self.admin_url).await?;
            self.postmaster = postmaster_of(&mut self.admin).await?;
            // Planning counted apart (a setting of the library, known once it is loaded): a
            // statement planned afresh at every call shows as plans = calls.
            sqlx::query("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
                .execute(&mut self.admin)
                .await?;
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&mut self.admin)
                .await?;
        }
        let preload: String = sqlx::query_scalar("SHOW shared_preload_libraries")
            .fetch_one(&mut self.admin)
            .await?;
        if !preload.contains("pg_stat_statements") {
            return Err(
                "--profile needs pg_stat_statements in the server's shared_preload_libraries"
                    .into(),
            );
        }
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut self.admin)
            .await?;
        Ok(())
    }

    /// Stops a private cluster and removes its folder.
    pub fn shutdown(&self) {
        if let Some(cluster) = &self.cluster {
            if let Err(e) = cluster.stop(false) {
                eprintln!("bench: private PostgreSQL did not stop cleanly: {e}");
            }
        }
        if let Some(dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Whether the bench can take this server away and bring it back (a private cluster).
    pub fn can_stop(&self) -> bool {
        self.cluster.is_some()
    }

    /// Takes PostgreSQL away the way a crash does (`pg_ctl stop -m immediate`): every
    /// connection breaks, new ones are refused. Only for a private cluster.
    ///
    /// # Errors
    ///
    /// When there is no private cluster or pg_ctl fails.
    pub async fn stop_cluster(&mut self) -> Result<(), BoxError> {
        let cluster = self
            .cluster
            .clone()
            .ok_or("only a private cluster can be stopped")?;
        tokio::task::spawn_blocking(move || cluster.stop(true)).await??;
        Ok(())
    }

    /// Starts the private cluster again (after crash recovery it accepts connections) and
    /// reconnects the admin connection.
    ///
    /// # Errors
    ///
    /// When there is no private cluster, it does not start, or the admin connection fails.
    pub async fn start_cluster(&mut self) -> Result<(), BoxError> {
        let cluster = self
            .cluster
            .clone()
            .ok_or("only a private cluster can be started")?;
        tokio::task::spawn_blocking(move || cluster.start(true)).await??;
        self.admin = PgConnection::connect(&self.admin_url).await?;
        self.postmaster = postmaster_of(&mut self.admin).await?;
        Ok(())
    }

    /// Drops the template (when running against a given server).
    pub async fn drop_template(&mut self) {
        let template = self.template.clone();
        let _ = self.drop_database(&template).await;
    }
}

/// The postmaster's pid: the parent of the backend serving `conn` (None when not local).
async fn postmaster_of(conn: &mut PgConnection) -> Result<Option<u32>, BoxError> {
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await?;
    Ok(crate::measure::parent_of(backend as u32))
}

/// A point in a run: WAL position and server time.
#[derive(Clone, Debug)]
pub struct Mark {
    /// `pg_current_wal_lsn()`.
    pub lsn: String,
    /// `clock_timestamp()`.
    pub at: String,
}

/// Creates the bench queue (with the dedup window for this scenario) and its partitions; returns
/// the partitions' ids in name order.
///
/// # Errors
///
/// Any database error.
pub async fn setup_queue(
    conn: &mut PgConnection,
    partitions: u64,
    dedup: bool,
) -> Result<Vec<i64>, BoxError> {
    let window = if dedup { 3600 } else { 0 };
    sqlx::query("INSERT INTO queen.queues (name, dedup_window_seconds) VALUES ($1, $2)")
        .bind(data::QUEUE)
        .bind(window)
        .execute(&mut *conn)
        .await?;
    let names: Vec<String> = (0..partitions).map(data::partition_name).collect();
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO queen.partitions (queue_id, name)
         SELECT q.id, x.name
           FROM queen.queues q, unnest($2::text[]) WITH ORDINALITY AS x(name, n)
          WHERE q.name = $1
          ORDER BY x.n
         RETURNING id",
    )
    .bind(data::QUEUE)
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    Ok(ids)
}

/// Turns `encryptionEnabled` on for the bench queue (its payloads are then sealed at commit).
///
/// # Errors
///
/// Any database error.
pub async fn encrypt_queue(conn: &mut PgConnection) -> Result<(), BoxError> {
    sqlx::query("UPDATE queen.queues SET encryption_enabled = true WHERE name = $1")
        .bind(data::QUEUE)
        .execute(conn)
        .await?;
    Ok(())
}

/// Messages and segments committed inside a window (by the segments' transaction time).
///
/// # Errors
///
/// Any database error.
pub async fn segments_between(
    conn: &mut PgConnection,
    a: &Mark,
    b: &Mark,
) -> Result<(i64, i64), BoxError> {
    let stats = segment_stats_between(conn, a, b).await?;
    Ok((stats.msgs, stats.segments))
}

/// What [`segment_stats_between`] counts.
pub struct SegmentStats {
    /// Messages in the window's segments.
    pub msgs: i64,
    /// Segments committed in the window.
    pub segments: i64,
    /// Messages per segment: 10th, 50th and 90th percentile (`None` without segments).
    pub sizes: Option<(f64, f64, f64)>,
}

/// The segments committed inside a window: how many, their messages, and their sizes.
///
/// # Errors
///
/// Any database error.
pub async fn segment_stats_between(
    conn: &mut PgConnection,
    a: &Mark,
    b: &Mark,
) -> Result<SegmentStats, BoxError> {
    type Row = (i64, i64, Option<f64>, Option<f64>, Option<f64>);
    let (msgs, segments, p10, p50, p90): Row = sqlx::query_as(
        "SELECT COALESCE(sum(msg_count), 0)::int8, count(*),
                percentile_cont(0.1) WITHIN GROUP (ORDER BY msg_count),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY msg_count),
                percentile_cont(0.9) WITHIN GROUP (ORDER BY msg_count)
           FROM queen.segments
          WHERE created_at >= $1::timestamptz AND created_at < $2::timestamptz",
    )
    .bind(&a.at)
    .bind(&b.at)
    .fetch_one(conn)
    .await?;
    Ok(SegmentStats {
        msgs,
        segments,
        sizes: match (p10, p50, p90) {
            (Some(p10), Some(p50), Some(p90)) => Some((p10, p50, p90)),
            _ => None,
        },
    })
}

/// Every message stored in the database's segments.
///
/// # Errors
///
/// Any database error.
pub async fn stored_messages(conn: &mut PgConnection) -> Result<i64, BoxError> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(sum(msg_count), 0)::int8 FROM queen.segments")
            .fetch_one(conn)
            .await?,
    )
}

/// How often each transaction id minted with `tag` is stored, by connection and sequence
/// (decoding every segment), and how many stored messages carry another id.
///
/// # Errors
///
/// Any database error, or a segment that does not decode.
pub async fn stored_transactions(
    conn: &mut PgConnection,
    tag: u64,
    counts: &mut crate::traffic::Counts,
) -> Result<u64, BoxError> {
    use futures_util::TryStreamExt;
    let mut other = 0;
    let mut rows =
        sqlx::query_scalar::<_, Vec<u8>>("SELECT frames FROM queen.segments").fetch(conn);
    while let Some(bytes) = rows.try_next().await? {
        for f in queen_broker::storage::segments::frames::decode(&bytes)? {
            match crate::traffic::parse_txn(f.transaction_id, tag) {
                Some((c, seq)) => counts.add(c, seq),
                None => other += 1,
            }
        }
    }
    Ok(other)
}

/// Queue mode's consumption: the sum of committed offsets over the bench queue's partitions
/// (offsets start at 0, so this is the number of messages consumed) and the leases still live.
///
/// # Errors
///
/// Any database error.
pub async fn consumed_offsets(conn: &mut PgConnection) -> Result<(i64, i64), BoxError> {
    Ok(sqlx::query_as(
        "SELECT COALESCE(sum(committed_offset), 0)::int8,
                count(*) FILTER (WHERE lease_expires_at > now())
           FROM queen.partition_consumers
          WHERE consumer_group = '__QUEUE_MODE__'",
    )
    .fetch_one(conn)
    .await?)
}

/// name, next offset, committed offset, lease live, attention at, last write xid, watermark.
type BehindRow = (
    String,
    i64,
    i64,
    Option<bool>,
    Option<String>,
    i64,
    i64,
    i64,
);

/// Partitions of the queue-mode consumer whose committed offset is behind the partition's end,
/// with what the queue-level pop would look at: a live lease, `attention_at`, the write
/// marker against the scan watermark. Reported when messages were not consumed.
pub async fn behind(conn: &mut PgConnection) -> Result<Vec<String>, BoxError> {
    let rows: Vec<BehindRow> = sqlx::query_as(
        "SELECT p.name, p.next_offset, c.committed_offset, c.lease_expires_at > now(),
                    c.attention_at::text, p.last_write_xid, s.scan_xid, s.scan_pid
               FROM queen.partitions p
               JOIN queen.partition_consumers c
                 ON c.partition_id = p.id AND c.consumer_group = '__QUEUE_MODE__'
               JOIN queen.consumer_subscriptions s
                 ON s.queue_id = p.queue_id AND s.consumer_group = c.consumer_group
              WHERE c.committed_offset < p.next_offset
              ORDER BY p.name
              LIMIT 20",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, next, committed, live, attention, xid, sx, sp)| {
            format!(
                "{name}: offsets {committed}..{next}, lease live {live:?}, attention {attention:?}, \
                 written by xid {xid}, watermark ({sx}, {sp})"
            )
        })
        .collect())
}
