//! A private PostgreSQL cluster started from the locally installed server binaries.
//!
//! The broker uses it when no database is configured and none answers on localhost:5432; the
//! test support uses it for throwaway clusters. When running as root the server runs as the
//! `postgres` user (PostgreSQL refuses root), through `runuser`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a private cluster could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No `initdb`/`pg_ctl` found.
    #[error(
        "no PostgreSQL server binaries found (looked in PG_BIN_DIR, pg_config --bindir and \
         /usr/lib/postgresql/*/bin); install PostgreSQL or point PG_HOST/DATABASE_URL at a running server"
    )]
    NoBinaries,
    /// A command failed.
    #[error("{command} failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its output or error.
        detail: String,
    },
}

/// A PostgreSQL cluster in a data folder of its own, on 127.0.0.1.
#[derive(Debug, Clone)]
pub struct PrivateCluster {
    /// The data folder.
    pub data_dir: PathBuf,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    bin_dir: PathBuf,
    as_postgres: bool,
    /// Certificate and key files served with `ssl=on` ([`PrivateCluster::with_tls`]).
    tls: Option<(PathBuf, PathBuf)>,
}

/// Finds the directory holding `initdb` and `pg_ctl`.
pub fn find_bin_dir() -> Option<PathBuf> {
    let has_tools = |d: &Path| d.join("initdb").exists() && d.join("pg_ctl").exists();
    if let Some(dir) = std::env::var_os("PG_BIN_DIR").map(PathBuf::from) {
        if has_tools(&dir) {
            return Some(dir);
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_tools(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Whether this process runs as root (PostgreSQL's tools must then run as `postgres`).
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PrivateCluster {
    /// Describes a cluster in `data_dir` on `port` (nothing is started yet).
    ///
    /// # Errors
    ///
    /// [`ClusterError::NoBinaries`] when the server binaries are missing.
    pub fn new(data_dir: &Path, port: u16) -> Result<Self, ClusterError> {
        let bin_dir = find_bin_dir().ok_or(ClusterError::NoBinaries)?;
        Ok(Self {
            data_dir: data_dir.to_path_buf(),
            port,
            bin_dir,
            as_postgres: running_as_root(),
            tls: None,
        })
    }

    /// Serves TLS (`ssl=on`) with this PEM certificate and key: [`PrivateCluster::start`]
    /// copies them into the data folder as `server.crt` and `server.key` (owner-only, as
    /// PostgreSQL requires) each time it starts the server. Plain connections stay allowed
    /// (initdb's `pg_hba.conf`), so a client's `sslmode` decides.
    pub fn with_tls(mut self, cert: &Path, key: &Path) -> Self {
        self.tls = Some((cert.to_path_buf(), key.to_path_buf()));
        self
    }

    /// Copies the certificate and key of [`PrivateCluster::with_tls`] into the data folder.
    fn install_tls(&self, cert: &Path, key: &Path) -> Result<(), ClusterError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |e: std::io::Error| ClusterError::Command {
            command: "install server.crt and server.key".into(),
            detail: e.to_string(),
        };
        let (crt, pem) = (
            self.data_dir.join("server.crt"),
            self.data_dir.join("server.key"),
        );
        std::fs::copy(cert, &crt).map_err(io)?;
        std::fs::copy(key, &pem).map_err(io)?;
        std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        if self.as_postgres {
            let mut c = Command::new("chown");
            c.arg("postgres:postgres").arg(&crt).arg(&pem);
            self.run(c)?;
        }
        Ok(())
    }

    fn command(&self, tool: &str) -> Command {
        let exe = self.bin_dir.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    fn run(&self, mut cmd: Command) -> Result<(), ClusterError> {
        let line = format!("{cmd:?}");
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ClusterError::Command {
                command: line.clone(),
                detail: e.to_string(),
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(ClusterError::Command {
                command: line,
                detail: format!(
                    "{} {}",
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })
        }
    }

    /// Gives the data folder to the `postgres` user (when running as root) and makes the
    /// folders above it traversable by that user.
    fn hand_to_postgres(&self) -> Result<(), ClusterError> {
        if !self.as_postgres {
            return Ok(());
        }
        self.run({
            let mut c = Command::new("chown");
            c.args(["-R", "postgres:postgres"]).arg(&self.data_dir);
            c
        })?;
        // The folders above must be traversable by the postgres user.
        let mut parent = self.data_dir.parent();
        while let Some(dir) = parent {
            if dir.as_os_str().is_empty() || dir == Path::new("/") {
                break;
            }
            if let Ok(meta) = std::fs::metadata(dir) {
                use std::os::unix::fs::PermissionsExt;
                let mode = meta.permissions().mode();
                if mode & 0o001 == 0 {
                    let _ = std::fs::set_permissions(
                        dir,
                        std::fs::Permissions::from_mode(mode | 0o001),
                    );
                }
            }
            parent = dir.parent();
        }
        Ok(())
    }

    /// Fills this cluster's (empty or missing) data folder with a base backup of the running
    /// `primary` and makes it its streaming standby (`pg_basebackup -R`: `standby.signal` and
    /// `primary_conninfo`); [`PrivateCluster::start`] then starts it as a hot standby. Needs
    /// replication connections from 127.0.0.1, which the clusters made here allow (initdb's
    /// `--auth=trust` with its default `pg_hba.conf`, `wal_level=replica`).
    ///
    /// # Errors
    ///
    /// [`ClusterError`] when the folder cannot be prepared or `pg_basebackup` fails.
    pub fn base_backup_of(&self, primary: &PrivateCluster) -> Result<(), ClusterError> {
        std::fs::create_dir_all(&self.data_dir).map_err(|e| ClusterError::Command {
            command: "prepare standby data folder".into(),
            detail: e.to_string(),
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(&self.data_dir, std::fs::Permissions::from_mode(0o700));
        }
        self.hand_to_postgres()?;
        let mut c = self.command("pg_basebackup");
        c.args(["-h", "127.0.0.1", "-p"])
            .arg(primary.port.to_string())
            .args(["-U", "postgres", "-D"])
            .arg(&self.data_dir)
            .args(["-R", "-X", "stream", "--checkpoint=fast", "--no-sync"]);
        self.run(c)
    }

    /// Makes this stopped former primary a standby of `source`, the standby promoted in its
    /// place: `pg_rewind` undoes what this cluster wrote after the two timelines forked (it
    /// first completes crash recovery itself when this cluster was crash-stopped) and, with
    /// `-R`, writes `standby.signal` and a `primary_conninfo` naming `source`;
    /// [`PrivateCluster::start`] then starts it streaming from `source`. Needs
    /// `wal_log_hints = on` (or data checksums) on both since before the fork, and `source`
    /// checkpointed after its promotion.
    ///
    /// # Errors
    ///
    /// [`ClusterError`] when `pg_rewind` fails (e.g. the WAL it needs is gone).
    pub fn rewind_from(&self, source: &PrivateCluster) -> Result<(), ClusterError> {
        let mut c = self.command("pg_rewind");
        c.arg("-D")
            .arg(&self.data_dir)
            .arg(format!(
                "--source-server=host=127.0.0.1 port={} user=postgres dbname=postgres",
                source.port
            ))
            .args(["-R", "--no-sync"]);
        self.run(c)
    }

    /// Promotes this standby to a primary (`pg_ctl promote -w`: returns once it accepts
    /// writes).
    ///
    /// # Errors
    ///
    /// [`ClusterError`] when pg_ctl fails (e.g. the cluster is not a standby).
    pub fn promote(&self) -> Result<(), ClusterError> {
        let mut c = self.command("pg_ctl");
        c.arg("promote").arg("-w").arg("-D").arg(&self.data_dir);
        self.run(c)
    }

    /// Creates the cluster if the folder holds none, then starts it (`pg_ctl start -w`).
    /// `durable = false` turns fsync off (throwaway test clusters only).
    ///
    /// # Errors
    ///
    /// [`ClusterError`] when initdb or pg_ctl fails.
    pub fn start(&self, durable: bool) -> Result<(), ClusterError> {
        let io = |e: std::io::Error| ClusterError::Command {
            command: "prepare data folder".into(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(&self.data_dir).map_err(io)?;
        self.hand_to_postgres()?;
        if !self.data_dir.join("PG_VERSION").exists() {
            let mut c = self.command("initdb");
            c.arg("-D").arg(&self.data_dir).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]);
            self.run(c)?;
        }
        let mut opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=300",
            self.port,
            self.data_dir.display()
        );
        if !durable {
            opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        if let Some((cert, key)) = &self.tls {
            self.install_tls(cert, key)?;
            opts.push_str(" -c ssl=on");
        }
        let mut c = self.command("pg_ctl");
        c.arg("start")
            .arg("-w")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(self.data_dir.join("server.log"))
            .arg("-o")
            .arg(opts);
        self.run(c)
    }

    /// Stops the cluster (`immediate = true` is a crash stop, for outage tests).
    ///
    /// # Errors
    ///
    /// [`ClusterError`] when pg_ctl fails.
    pub fn stop(&self, immediate: bool) -> Result<(), ClusterError> {
        let mut c = self.command("pg_ctl");
        c.arg("stop")
            .arg("-w")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", if immediate { "immediate" } else { "fast" }]);
        self.run(c)
    }

    /// The URL of database `db` on this cluster.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The shell command that stops this cluster (for a watchdog process).
    pub fn stop_command_line(&self) -> String {
        let pg_ctl = self.bin_dir.join("pg_ctl");
        let prefix = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        format!(
            "{prefix}{} stop -D {} -m immediate",
            pg_ctl.display(),
            self.data_dir.display()
        )
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; another process may take it later).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
