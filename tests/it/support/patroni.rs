//! A Patroni cluster made by the test, on loopback only: a single-node etcd (the DCS, on ports
//! of its own) and two PostgreSQL nodes, each run by its own `patroni` process (Debian's
//! `patroni` and `etcd-server`) from a YAML configuration written here. `n1` bootstraps the
//! cluster with the installed server binaries; `n2` joins as its streaming replica. The timing
//! is shortened (leader key TTL 5 s, a loop every second) so that a dead leader is replaced
//! within seconds. With `synchronous_mode: true` Patroni names the replica in
//! `synchronous_standby_names` and promotes only a synchronous standby; not strict, so that
//! the promoted node, with no standby left, takes writes alone (as pg_auto_failover does).
//!
//! [`PatroniCluster::start`] answers `None` when `patroni` or `etcd` is not installed (the test
//! then says it skipped), unless `QUEEN_REQUIRE_HA=1` (as `.ci/run` sets), which makes that a
//! failure. Everything is stopped and removed on drop, and by a watchdog process if the test
//! process dies first. Never touches a process it did not start.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use queen_broker::pg::{find_bin_dir, free_port, running_as_root};
use serde_json::Value;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::support::machine::{kill_group, kill_machine, watchdog};

/// Patroni's timing (its defaults: 30 / 10 / 10 s). The leader renews its key every
/// `loop_wait`; a replica takes over once the key has expired (`ttl`), so a dead leader is
/// replaced about `ttl` seconds after it died. `ttl` ≥ `loop_wait` + 2 × `retry_timeout`, as
/// Patroni asks.
const TTL_SECS: u32 = 5;
const LOOP_WAIT_SECS: u32 = 1;
const RETRY_TIMEOUT_SECS: u32 = 2;

/// The path of an executable on the PATH.
fn tool(name: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// One member as Patroni's `GET /cluster` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// `leader`, `replica` or `sync_standby`.
    pub role: String,
    /// `running`, `starting`, `stopped`, …
    pub state: String,
    pub timeline: Option<i64>,
}

/// etcd and two Patroni nodes, `n1` (the first leader) and `n2`.
pub struct PatroniCluster {
    dir: PathBuf,
    bin_dir: PathBuf,
    as_postgres: bool,
    /// etcd's client port.
    pub etcd_port: u16,
    /// The nodes' PostgreSQL ports, `n1` then `n2`.
    pub ports: [u16; 2],
    /// The nodes' Patroni REST API ports.
    pub api_ports: [u16; 2],
    /// Processes started here, each leading its own process group: etcd, n1's patroni, n2's
    /// patroni. `None` once killed (its PID may be someone else's by then).
    processes: Vec<Option<Child>>,
    http: awc::Client,
}

impl PatroniCluster {
    /// Starts etcd, `n1` (which bootstraps the cluster), then `n2` as its replica, and waits
    /// until `n1` leads and `n2` streams from it (as its synchronous standby when
    /// `synchronous`), bounded; then creates the database `queen`. `None` when patroni or etcd
    /// is missing and not required.
    pub async fn start(synchronous: bool) -> Option<Self> {
        let (Some(patroni), Some(etcd)) = (tool("patroni"), tool("etcd")) else {
            assert!(
                std::env::var("QUEEN_REQUIRE_HA").as_deref() != Ok("1"),
                "QUEEN_REQUIRE_HA=1 but patroni or etcd is not installed \
                 (Debian: patroni etcd-server python3-etcd)"
            );
            eprintln!("skipped: patroni or etcd not installed (Debian: patroni etcd-server)");
            return None;
        };
        let bin_dir = find_bin_dir().expect("PostgreSQL server binaries");
        let dir = std::env::temp_dir().join(format!("queen-patroni-{}", Uuid::new_v4().simple()));
        let port = || free_port().expect("port");
        let mut cluster = Self {
            dir,
            bin_dir,
            as_postgres: running_as_root(),
            etcd_port: port(),
            ports: [port(), port()],
            api_ports: [port(), port()],
            processes: Vec::new(),
            http: awc::Client::builder()
                .timeout(Duration::from_secs(2))
                .finish(),
        };
        for node in 0..2 {
            std::fs::create_dir_all(cluster.node_dir(node)).expect("node folder");
            std::fs::write(
                cluster.dir.join(format!("n{}.yml", node + 1)),
                cluster.config(node, synchronous),
            )
            .expect("patroni configuration");
        }
        if cluster.as_postgres {
            // PostgreSQL refuses to run as root: everything runs as postgres, in its folder.
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .expect("chown")
                .success();
            assert!(ok, "chown of {}", cluster.dir.display());
        }
        cluster.watchdog();

        let peer = format!("http://127.0.0.1:{}", free_port().expect("port"));
        let client = format!("http://127.0.0.1:{}", cluster.etcd_port);
        let data = cluster.dir.join("etcd");
        cluster.spawn(
            "etcd",
            &etcd,
            &[
                "--name",
                "e1",
                "--data-dir",
                &data.to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &format!("e1={peer}"),
            ],
        );
        let health = &format!("{client}/health");
        let c = &cluster;
        c.wait_until("etcd answers healthy", 30, || async move {
            c.get_json(health)
                .await
                .is_some_and(|(s, body)| s == 200 && body["health"] == "true")
        })
        .await;

        let config = cluster.dir.join("n1.yml");
        cluster.spawn("n1", &patroni, &[&config.to_string_lossy()]);
        let c = &cluster;
        c.wait_until("n1 leads the new cluster", 60, || async move {
            c.members()
                .await
                .iter()
                .any(|m| m.name == "n1" && m.role == "leader" && m.state == "running")
        })
        .await;
        let config = cluster.dir.join("n2.yml");
        cluster.spawn("n2", &patroni, &[&config.to_string_lossy()]);
        let (role, sync_state) = if synchronous {
            ("sync_standby", "sync")
        } else {
            ("replica", "async")
        };
        let primary = &cluster.node_url(0, "postgres");
        let c = &cluster;
        c.wait_until(
            &format!("n2 streams from n1 as its {role}"),
            90,
            || async move {
                let joined = c
                    .members()
                    .await
                    .iter()
                    .any(|m| m.name == "n2" && m.role == role && m.state == "running");
                let Ok(mut n1) = PgConnection::connect(primary).await else {
                    return false;
                };
                let streaming: i64 = sqlx::query_scalar(
                    "SELECT count(*)
                       FROM pg_stat_replication
                      WHERE application_name = 'n2'
                        AND state = 'streaming'
                        AND sync_state = $1",
                )
                .bind(sync_state)
                .fetch_one(&mut n1)
                .await
                .unwrap_or(0);
                joined && streaming == 1
            },
        )
        .await;
        let mut n1 = PgConnection::connect(primary).await.expect("n1 connects");
        sqlx::query("CREATE DATABASE queen")
            .execute(&mut n1)
            .await
            .expect("create the broker's database");
        Some(cluster)
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

    /// The members as Patroni reports them (`GET /cluster`, asked of the first node whose REST
    /// API answers); empty when none does.
    pub async fn members(&self) -> Vec<Member> {
        for port in self.api_ports {
            let Some((200, body)) = self
                .get_json(&format!("http://127.0.0.1:{port}/cluster"))
                .await
            else {
                continue;
            };
            return body["members"]
                .as_array()
                .map(|members| {
                    members
                        .iter()
                        .map(|m| Member {
                            name: m["name"].as_str().unwrap_or_default().to_string(),
                            role: m["role"].as_str().unwrap_or_default().to_string(),
                            state: m["state"].as_str().unwrap_or_default().to_string(),
                            timeline: m["timeline"].as_i64(),
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// The node's machine dies: its patroni, its PostgreSQL and every backend are killed
    /// (SIGKILL), nothing is shut down cleanly; its leader key is left to expire.
    pub fn kill_node(&mut self, node: usize) {
        let mut patroni = self.processes[node + 1].take().expect("the node is alive");
        kill_machine(&self.node_dir(node).join("data"), &mut patroni);
    }

    /// The last lines of every process's log (for a failure message).
    pub fn logs(&self) -> String {
        ["etcd", "n1", "n2"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {name}.log\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn node_dir(&self, node: usize) -> PathBuf {
        self.dir.join(format!("n{}", node + 1))
    }

    /// The node's Patroni configuration: everything on loopback, trust authentication for
    /// loopback connections (the test's own throwaway cluster), the socket in the node's folder.
    fn config(&self, node: usize, synchronous: bool) -> String {
        let name = format!("n{}", node + 1);
        let node_dir = self.node_dir(node);
        let yaml_path = |p: &Path| format!("'{}'", p.display());
        format!(
            "scope: queen
namespace: /queen/
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  host: 127.0.0.1:{etcd}
watchdog:
  mode: 'off'
bootstrap:
  dcs:
    ttl: {TTL_SECS}
    loop_wait: {LOOP_WAIT_SECS}
    retry_timeout: {RETRY_TIMEOUT_SECS}
    synchronous_mode: {synchronous}
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: false
  initdb:
  - encoding: UTF8
  pg_hba:
  - host replication all 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {pgpass}
  basebackup:
  - checkpoint: fast
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  parameters:
    unix_socket_directories: {socket}
",
            api = self.api_ports[node],
            etcd = self.etcd_port,
            port = self.ports[node],
            data = yaml_path(&node_dir.join("data")),
            bin = yaml_path(&self.bin_dir),
            pgpass = yaml_path(&node_dir.join("pgpass")),
            socket = yaml_path(&node_dir),
        )
    }

    /// Starts `program args…` (as the postgres user when root) in a process group of its own,
    /// its output in `<name>.log`.
    fn spawn(&mut self, name: &str, program: &Path, args: &[&str]) {
        let log = File::create(self.dir.join(format!("{name}.log"))).expect("log file");
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        c.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .process_group(0);
        let child = c.spawn().unwrap_or_else(|e| panic!("{name}: {e}"));
        self.processes.push(Some(child));
    }

    /// `GET url` → (status, JSON body); `None` when nothing answers.
    async fn get_json(&self, url: &str) -> Option<(u16, Value)> {
        let mut reply = self.http.get(url).send().await.ok()?;
        let body = reply.body().await.ok()?;
        Some((
            reply.status().as_u16(),
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        ))
    }

    /// Polls `check` every 200 ms until it holds; fails with the logs after `secs`.
    async fn wait_until<F, Fut>(&self, what: &str, secs: u64, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !check().await {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {secs} s; members {:?}\n{}",
                self.members().await,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The commands that stop each node's PostgreSQL (its postmaster outlives patroni: Patroni
    /// starts it in a session of its own).
    fn stop_servers(&self) -> Vec<String> {
        let prefix = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        (0..2)
            .map(|node| {
                format!(
                    "{prefix}{} stop -D {} -m immediate >/dev/null 2>&1",
                    self.bin_dir.join("pg_ctl").display(),
                    self.node_dir(node).join("data").display()
                )
            })
            .collect()
    }

    /// A process that stops everything if this test process dies before the drop does: the
    /// patroni and etcd processes started with this cluster's folder in their arguments, then
    /// each server.
    fn watchdog(&self) {
        watchdog(&format!(
            "for p in $(pgrep -f '[p]atroni {dir}/') $(pgrep -f '[e]tcd .*{dir}/'); do \
             kill -s KILL -- $p; done; {stop}; rm -rf {dir}",
            dir = self.dir.display(),
            stop = self.stop_servers().join("; "),
        ));
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        for mut child in self.processes.drain(..).flatten() {
            kill_group(child.id());
            let _ = child.wait();
        }
        for command in self.stop_servers() {
            let _ = Command::new("sh").arg("-c").arg(command).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
