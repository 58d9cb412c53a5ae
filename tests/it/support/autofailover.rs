//! A pg_auto_failover formation made by the test, on loopback only: a monitor and two
//! PostgreSQL nodes, each run by its own `pg_autoctl … --run` process (Debian's
//! `postgresql-NN-auto-failover`). The monitor is tuned to notice a dead primary within about
//! a second (its defaults take 20 s). The standby joins with synchronous replication (the
//! default `--replication-quorum true`: `synchronous_standby_names = 'ANY 1 (…)'`) or, asked
//! for, asynchronously (`--replication-quorum false`).
//!
//! [`Formation::start`] answers `None` when `pg_autoctl` is not installed (the test then says
//! it skipped), unless `QUEEN_REQUIRE_HA=1` (as `.ci/run` sets), which makes that a failure.
//! Everything is stopped and removed on drop, and by a watchdog process if the test process
//! dies first.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use queen_broker::pg::{find_bin_dir, free_port, running_as_root};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::support::machine::{kill_group, kill_machine, watchdog};

/// The monitor's timing, shortened so that a failover takes seconds, not half a minute.
const MONITOR_TIMING: [(&str, &str); 6] = [
    ("health_check_period", "500"),
    ("health_check_timeout", "500"),
    ("health_check_max_retries", "1"),
    ("health_check_retry_delay", "200"),
    ("node_considered_unhealthy_timeout", "1000"),
    ("primary_demote_timeout", "2000"),
];

/// Whether `pg_autoctl` is on the PATH.
pub fn pg_autoctl() -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", "command -v pg_autoctl"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// A monitor and two nodes, `n1` (the first primary) and `n2`.
pub struct Formation {
    dir: PathBuf,
    bin_dir: PathBuf,
    autoctl: PathBuf,
    as_postgres: bool,
    /// The monitor's port.
    pub monitor_port: u16,
    /// The nodes' ports, `n1` then `n2`.
    pub ports: [u16; 2],
    /// The `pg_autoctl --run` processes (each leads its own process group): the monitor, n1, n2.
    processes: Vec<Child>,
}

impl Formation {
    /// Starts the monitor, `n1`, then `n2` as its standby (synchronous or not), and waits until
    /// the monitor reports them `primary` and `secondary` (bounded). `None` when pg_autoctl is
    /// missing and not required.
    pub async fn start(synchronous: bool) -> Option<Self> {
        let Some(autoctl) = pg_autoctl() else {
            assert!(
                std::env::var("QUEEN_REQUIRE_HA").as_deref() != Ok("1"),
                "QUEEN_REQUIRE_HA=1 but pg_autoctl is not installed \
                 (Debian: postgresql-NN-auto-failover)"
            );
            eprintln!("skipped: pg_autoctl not installed (Debian: postgresql-NN-auto-failover)");
            return None;
        };
        let bin_dir = find_bin_dir().expect("PostgreSQL server binaries");
        let dir = std::env::temp_dir().join(format!("queen-ha-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("formation folder");
        let as_postgres = running_as_root();
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("chown")
                .success();
            assert!(ok, "chown of {}", dir.display());
        }
        let mut formation = Self {
            dir,
            bin_dir,
            autoctl,
            as_postgres,
            monitor_port: free_port().expect("port"),
            ports: [free_port().expect("port"), free_port().expect("port")],
            processes: Vec::new(),
        };
        formation.watchdog();

        let pgdata = formation.dir.join("monitor");
        let port = formation.monitor_port.to_string();
        formation.spawn(
            "monitor",
            &[
                "create",
                "monitor",
                "--pgdata",
                &pgdata.to_string_lossy(),
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
                "--run",
            ],
        );
        let mut monitor = formation
            .connect_when_ready(
                formation.monitor_port,
                "pg_auto_failover",
                "pgautofailover.node",
            )
            .await;
        for (name, value) in MONITOR_TIMING {
            sqlx::query(&format!("ALTER SYSTEM SET pgautofailover.{name} = {value}"))
                .execute(&mut monitor)
                .await
                .expect("tune the monitor");
        }
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut monitor)
            .await
            .expect("reload the monitor");

        formation.spawn_node(0, true);
        formation.wait_for(&[("n1", "single")], 60).await;
        formation.spawn_node(1, synchronous);
        // pg_autoctl takes the standby's base backup without a fast checkpoint: it waits for the
        // primary's next one (checkpoint_timeout, 5 minutes). Checkpoints are asked for here
        // until the standby has joined.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if formation.states().await
                == [
                    ("n1".to_string(), "primary".to_string()),
                    ("n2".to_string(), "secondary".to_string()),
                ]
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the formation did not reach primary + secondary within 90 s: {:?}\n{}",
                formation.states().await,
                formation.logs()
            );
            if let Ok(mut n1) = PgConnection::connect(&formation.node_url(0, "postgres")).await {
                let _ = sqlx::query("CHECKPOINT").execute(&mut n1).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Some(formation)
    }

    /// The brokers' URL: both nodes, libpq's multi-host form.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
            self.ports[0], self.ports[1]
        )
    }

    /// One node's URL.
    pub fn node_url(&self, node: usize, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.ports[node])
    }

    /// What the monitor reports per node: (name, reported state), in node order.
    pub async fn states(&self) -> Vec<(String, String)> {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover",
            self.monitor_port
        );
        let Ok(mut conn) = PgConnection::connect(&url).await else {
            return Vec::new();
        };
        sqlx::query_as(
            "SELECT nodename::text, reportedstate::text FROM pgautofailover.node ORDER BY nodeid",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap_or_default()
    }

    /// Waits until every named node reports the state given (bounded by `secs`).
    pub async fn wait_for(&self, want: &[(&str, &str)], secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let states = self.states().await;
            if want.iter().all(|(node, state)| {
                states
                    .iter()
                    .any(|(n, s)| n.as_str() == *node && s.as_str() == *state)
            }) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the formation did not reach {want:?} within {secs} s: {states:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The node's machine dies: its pg_autoctl, its PostgreSQL and every backend are killed
    /// (SIGKILL), nothing is shut down cleanly ([`kill_machine`]).
    pub fn kill_node(&mut self, node: usize) {
        let pgdata = self.dir.join(format!("n{}", node + 1));
        kill_machine(&pgdata, &mut self.processes[node + 1]);
    }

    fn spawn_node(&mut self, node: usize, quorum: bool) {
        let name = format!("n{}", node + 1);
        let pgdata = self.dir.join(&name);
        let port = self.ports[node].to_string();
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        self.spawn(
            &name,
            &[
                "create",
                "postgres",
                "--pgdata",
                &pgdata.to_string_lossy(),
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--listen",
                "127.0.0.1",
                "--name",
                &name,
                "--auth",
                "trust",
                "--no-ssl",
                "--monitor",
                &monitor,
                "--dbname",
                "queen",
                "--username",
                "postgres",
                "--replication-quorum",
                if quorum { "true" } else { "false" },
                "--run",
            ],
        );
    }

    /// Starts `pg_autoctl args…` (as the postgres user when root) in a process group of its
    /// own, its output in `<name>.log`.
    fn spawn(&mut self, name: &str, args: &[&str]) {
        let log = File::create(self.dir.join(format!("{name}.log"))).expect("log file");
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&self.autoctl);
            c
        } else {
            Command::new(&self.autoctl)
        };
        let xdg = |sub: &str| self.dir.join("xdg").join(sub);
        c.args(args)
            .args(["--pgctl"])
            .arg(self.bin_dir.join("pg_ctl"))
            .env("XDG_CONFIG_HOME", xdg("config"))
            .env("XDG_DATA_HOME", xdg("data"))
            .env("XDG_RUNTIME_DIR", xdg("run"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .process_group(0);
        self.processes.push(
            c.spawn()
                .unwrap_or_else(|e| panic!("pg_autoctl {name}: {e}")),
        );
    }

    /// Connects to `db` on `port` once `table` exists there (bounded).
    async fn connect_when_ready(&self, port: u16, db: &str, table: &str) -> PgConnection {
        let url = format!("postgres://postgres@127.0.0.1:{port}/{db}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut conn) = PgConnection::connect(&url).await {
                let exists: Option<bool> = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                    .bind(table)
                    .fetch_one(&mut conn)
                    .await
                    .ok();
                if exists == Some(true) {
                    return conn;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{table} on port {port} not ready within 60 s\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last lines of every process's log (for a failure message).
    pub fn logs(&self) -> String {
        ["monitor", "n1", "n2"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {name}.log\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The commands that stop everything: the process groups, then each server.
    fn stop_commands(&self) -> Vec<String> {
        let mut commands: Vec<String> = self
            .processes
            .iter()
            .map(|c| format!("kill -s KILL -- -{} 2>/dev/null", c.id()))
            .collect();
        let prefix = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        for data in ["monitor", "n1", "n2"] {
            commands.push(format!(
                "{prefix}{} stop -D {} -m immediate >/dev/null 2>&1",
                self.bin_dir.join("pg_ctl").display(),
                self.dir.join(data).display()
            ));
        }
        commands
    }

    /// A process that stops everything if this test process dies before the drop does.
    fn watchdog(&self) {
        watchdog(&format!(
            "for p in $(pgrep -f '[p]g_autoctl.*{dir}'); do kill -s KILL -- $p; done; {stop}; \
             rm -rf {dir}",
            dir = self.dir.display(),
            stop = self.stop_commands().join("; "),
        ));
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        for child in &mut self.processes {
            kill_group(child.id());
            let _ = child.wait();
        }
        for command in self.stop_commands().into_iter().skip(self.processes.len()) {
            let _ = Command::new("sh").arg("-c").arg(command).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
