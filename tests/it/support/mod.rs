//! Test support: one throwaway PostgreSQL cluster for the whole test binary (or
//! `QUEEN_TEST_DATABASE_URL`), a database per test cloned from a migrated template, and the
//! broker on 127.0.0.1:0. `auth`, `consuming` and `proxy` hold the helpers of those areas;
//! `replica` makes a primary with a streaming standby for the switchover tests; `tls` makes
//! throwaway certificate authorities. The HA engine tests make their clusters with
//! `autofailover` (pg_auto_failover) and `patroni` (Patroni with etcd), kill a node's machine
//! with `machine`, and run the failover workload of `load`.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod auth;
pub mod autofailover;
pub mod consuming;
pub mod ha_pair;
pub mod load;
pub mod machine;
pub mod patroni;
pub mod proxy;
pub mod replica;
pub mod tls;

use queen_broker::app::{self, Broker};
use queen_broker::pg::PrivateCluster;
use queen_broker::settings::Settings;
use queen_broker::storage::{self, segments::frames};
use serde_json::Value;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// Waits for an event: polls `check` (every 10 ms) until it yields `Some`, and fails the test
/// naming `what` when `within` has passed first. Tests wait on what they expect to see, never
/// for a fixed time.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every node of a JSON plan (`EXPLAIN (FORMAT JSON)`'s `[0]["Plan"]`), the root first.
pub fn plan_nodes(plan: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    let mut todo = vec![plan];
    while let Some(node) = todo.pop() {
        out.push(node);
        if let Some(children) = node["Plans"].as_array() {
            todo.extend(children.iter().rev());
        }
    }
    out
}

/// The PostgreSQL the tests of this binary use.
pub struct TestPg {
    /// URL of the server's `postgres` database (admin connection).
    pub admin_url: String,
    template: String,
}

static PG: OnceLock<TestPg> = OnceLock::new();
static TEMPLATE_READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

fn base_url(url: &str) -> &str {
    url.rsplit_once('/').map_or(url, |(base, _)| base)
}

/// Starts (once) the cluster for this test binary.
pub fn pg() -> &'static TestPg {
    PG.get_or_init(|| {
        let template = format!("queen_template_{}", std::process::id());
        if let Ok(url) = std::env::var("QUEEN_TEST_DATABASE_URL") {
            return TestPg { admin_url: url, template };
        }
        let dir = std::env::temp_dir().join(format!("queen-test-pg-{}", Uuid::new_v4().simple()));
        let port = queen_broker::pg::free_port().expect("a free port");
        let cluster = PrivateCluster::new(&dir, port).expect("PostgreSQL server binaries (see README)");
        cluster.start(false).expect("throwaway PostgreSQL cluster starts");
        // Stop and remove the cluster when this test process exits, however it exits.
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            stop = cluster.stop_command_line(),
            dir = dir.display()
        );
        #[expect(
            clippy::zombie_processes,
            reason = "the watchdog outlives this process on purpose; init reaps it"
        )]
        let _watchdog = Command::new("sh")
            .arg("-c")
            .arg(watchdog)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("watchdog starts");
        TestPg { admin_url: cluster.url("postgres"), template }
    })
}

impl TestPg {
    /// The TCP port of the server.
    pub fn port(&self) -> u16 {
        let after = self.admin_url.rsplit_once(':').expect("url has a port").1;
        after
            .split('/')
            .next()
            .unwrap()
            .parse()
            .expect("numeric port")
    }
}

/// One test's database.
pub struct TestDb {
    /// Its URL.
    pub url: String,
}

impl TestPg {
    /// A new database with the broker's schema, cloned from a template migrated once.
    pub async fn fresh_database(&'static self) -> TestDb {
        TEMPLATE_READY
            .get_or_init(|| async {
                let mut admin = PgConnection::connect(&self.admin_url)
                    .await
                    .expect("admin connection");
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {}", self.template))
                    .execute(&mut admin)
                    .await;
                sqlx::query(&format!("CREATE DATABASE {}", self.template))
                    .execute(&mut admin)
                    .await
                    .expect("template");
                let url = format!("{}/{}", base_url(&self.admin_url), self.template);
                let mut conn = PgConnection::connect(&url)
                    .await
                    .expect("template connection");
                storage::MIGRATOR
                    .run(&mut conn)
                    .await
                    .expect("migrations run");
                conn.close().await.ok();
            })
            .await;
        let name = format!("queen_test_{}", Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("admin connection");
        let mut attempt = 0;
        loop {
            let created = sqlx::query(&format!(
                "CREATE DATABASE {name} TEMPLATE {}",
                self.template
            ))
            .execute(&mut admin)
            .await;
            match created {
                Ok(_) => break,
                // Another test cloning the template at the same moment: take turns.
                Err(e) if attempt < 50 => {
                    attempt += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot create test database: {e}"),
            }
        }
        TestDb {
            url: format!("{}/{}", base_url(&self.admin_url), name),
        }
    }
}

/// A fresh database for one test.
pub async fn fresh_db() -> TestDb {
    pg().fresh_database().await
}

impl TestDb {
    /// A new connection to this database.
    pub async fn conn(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .expect("test database connection")
    }

    /// Every stored message of a partition, in offset order, decoded from its segments.
    pub async fn stored(&self, queue: &str, partition: &str) -> Vec<Stored> {
        let mut conn = self.conn().await;
        let rows: Vec<(i64, i32, Vec<u8>)> = sqlx::query_as(
            "SELECT s.base_offset, s.msg_count, s.frames
               FROM queen.segments s
               JOIN queen.partitions p ON p.id = s.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE q.name = $1 AND p.name = $2
              ORDER BY s.base_offset",
        )
        .bind(queue)
        .bind(partition)
        .fetch_all(&mut conn)
        .await
        .expect("segments query");
        let mut out = Vec::new();
        for (base, count, bytes) in rows {
            let decoded = frames::decode(&bytes).expect("frames decode");
            assert_eq!(
                decoded.len(),
                count as usize,
                "segment at {base}: msg_count matches its frames"
            );
            for (n, f) in decoded.into_iter().enumerate() {
                out.push(Stored {
                    offset: base + n as i64,
                    id: f.id,
                    transaction_id: f.transaction_id.to_string(),
                    payload: f.payload.to_string(),
                    producer_sub: f.producer_sub.map(str::to_string),
                    segment_base: base,
                });
            }
        }
        out
    }

    /// Runs one SQL statement.
    pub async fn exec(&self, sql: &str) {
        let mut conn = self.conn().await;
        sqlx::query(sql)
            .execute(&mut conn)
            .await
            .expect("statement runs");
    }
}

/// One stored message, as the tests read it back.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Offset in its partition.
    pub offset: i64,
    /// Message id.
    pub id: Uuid,
    /// Dedup key.
    pub transaction_id: String,
    /// Payload text.
    pub payload: String,
    /// Producer's sub.
    pub producer_sub: Option<String>,
    /// Base offset of its segment.
    pub segment_base: i64,
}

/// A broker running in this test's actix system.
pub struct TestApp {
    /// `http://127.0.0.1:port`.
    pub base: String,
    /// The broker.
    pub broker: Broker,
    /// Its spool directory.
    pub spool_dir: PathBuf,
    client: awc::Client,
}

/// Settings for a test broker on `db`, with `extra` variables on top.
pub fn test_settings(db: &TestDb, extra: &[(&str, &str)]) -> Settings {
    let spool = std::env::temp_dir().join(format!("queen-test-spool-{}", Uuid::new_v4().simple()));
    let mut env: HashMap<String, String> = [
        ("DATABASE_URL", db.url.as_str()),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("NUM_WORKERS", "2"),
        ("DB_POOL_SIZE", "4"),
        ("QUEEN_COMMITTERS", "2"),
        ("QUEEN_CONFIG", ""),
        ("LOG_LEVEL", "warn"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.insert("FILE_BUFFER_DIR".into(), spool.display().to_string());
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    Settings::from_map(env).expect("test settings are valid")
}

/// Starts a broker on `db`.
pub async fn spawn_app(db: &TestDb) -> TestApp {
    spawn_app_with(test_settings(db, &[])).await
}

/// Starts a broker with explicit settings.
pub async fn spawn_app_with(settings: Settings) -> TestApp {
    // `RUST_LOG=queen_broker=debug,broker_actors=debug cargo test …` shows the broker's log.
    let _ = env_logger::builder().is_test(true).try_init();
    let spool_dir = settings.file_buffer_dir.clone();
    let mut broker = app::start(settings).await.expect("broker starts");
    actix_web::rt::spawn(broker.server.take().expect("fresh broker has its server"));
    TestApp {
        base: format!("http://127.0.0.1:{}", broker.port),
        broker,
        spool_dir,
        // The broker closes a keep-alive connection idle for 5 s (actix-web's default); a
        // pooled connection idle for longer than 1 s is not reused, so a slow test step never
        // sends on a connection the broker is closing (a broken pipe).
        client: awc::Client::builder()
            .connector(awc::Connector::new().conn_keep_alive(Duration::from_secs(1)))
            .timeout(Duration::from_secs(60))
            .finish(),
    }
}

impl TestApp {
    /// Talks HTTPS to this broker (started with `QUEEN_TLS_*`) from here on, with a client of
    /// `config` (which trusts the test's CA).
    pub fn over_tls(mut self, config: std::sync::Arc<rustls::ClientConfig>) -> Self {
        self.base = self.base.replacen("http://", "https://", 1);
        self.client = awc::Client::builder()
            .connector(
                awc::Connector::new()
                    .rustls_0_23(config)
                    .conn_keep_alive(Duration::from_secs(1)),
            )
            .timeout(Duration::from_secs(60))
            .finish();
        self
    }
}

/// A response: status and JSON body (`Value::Null` when empty or not JSON).
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body as JSON.
    pub body: Value,
    /// Headers.
    pub headers: awc::http::header::HeaderMap,
}

impl TestApp {
    /// POSTs a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_raw(path, serde_json::to_vec(body).expect("json"))
            .await
    }

    /// POSTs raw bytes.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> Reply {
        let mut res = self
            .client
            .post(format!("{}{path}", self.base))
            .insert_header(("content-type", "application/json"))
            .send_body(body)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: request not sent: {e}"));
        let status = res.status();
        let bytes = res
            .body()
            .limit(256 * 1024 * 1024)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: body of the {status} answer not read: {e}"));
        Reply {
            status: res.status().as_u16(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers: res.headers().clone(),
        }
    }

    /// Sends a request without a body; returns the status, the raw body and the headers.
    async fn bodyless(
        &self,
        method: awc::http::Method,
        path: &str,
    ) -> (u16, bytes::Bytes, awc::http::header::HeaderMap) {
        self.try_bodyless(method, path)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`TestApp::bodyless`], with a transport failure (no answer, a body cut off) as an error
    /// that names the request.
    async fn try_bodyless(
        &self,
        method: awc::http::Method,
        path: &str,
    ) -> Result<(u16, bytes::Bytes, awc::http::header::HeaderMap), String> {
        let mut res = self
            .client
            .request(method.clone(), format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| format!("{method} {path}: request not sent: {e}"))?;
        let status = res.status();
        let bytes =
            res.body().limit(256 * 1024 * 1024).await.map_err(|e| {
                format!("{method} {path}: body of the {status} answer not read: {e}")
            })?;
        Ok((status.as_u16(), bytes, res.headers().clone()))
    }

    /// GETs a path; a transport failure is an `Err` naming it, not a panic.
    pub async fn try_get(&self, path: &str) -> Result<Reply, String> {
        let (status, bytes, headers) = self.try_bodyless(awc::http::Method::GET, path).await?;
        Ok(Reply {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers,
        })
    }

    /// GETs a path.
    pub async fn get(&self, path: &str) -> Reply {
        let (status, bytes, headers) = self.bodyless(awc::http::Method::GET, path).await;
        Reply {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers,
        }
    }

    /// DELETEs a path.
    pub async fn delete(&self, path: &str) -> Reply {
        let (status, bytes, headers) = self.bodyless(awc::http::Method::DELETE, path).await;
        Reply {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers,
        }
    }

    /// GETs a path and returns the status and the body's exact text (for byte-exact checks
    /// that a parsed `Value` would hide: key order, number spelling).
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let (status, bytes, _) = self.bodyless(awc::http::Method::GET, path).await;
        (
            status,
            String::from_utf8(bytes.to_vec()).expect("utf-8 body"),
        )
    }

    /// Pushes items; returns the reply.
    pub async fn push(&self, items: Value) -> Reply {
        self.post("/api/v1/push", &serde_json::json!({ "items": items }))
            .await
    }

    /// Waits (bounded) until the spool holds nothing left to replay.
    pub async fn drained(&self) {
        let spool = &self.broker.state.spool.state;
        eventually(
            Duration::from_secs(60),
            "the spool drains",
            move || async move { (spool.records() == 0).then_some(()) },
        )
        .await;
    }

    /// Spool files in this broker's spool directory.
    pub fn spool_files(&self) -> Vec<PathBuf> {
        broker_actors::spool::list_files(&self.spool_dir).unwrap_or_default()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Starts the stop; the runtime ending finishes it.
        drop(self.broker.handle.stop(false));
        self.broker.shutdown();
        let _ = std::fs::remove_dir_all(&self.spool_dir);
    }
}
