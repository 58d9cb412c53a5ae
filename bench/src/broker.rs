//! The broker under test, as a separate process (the release `queen-broker` binary): its own
//! runtime, its own CPU account, and a peak RSS that /proc can tell.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::HttpConn;
use crate::BoxError;

/// A running broker process; killed on drop if still running.
pub struct BrokerProcess {
    child: Child,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

/// Finds the broker binary: `--broker-bin`, else `queen-broker` beside this executable.
///
/// # Errors
///
/// When there is none (the message says how to build it).
pub fn locate(given: Option<&Path>) -> Result<PathBuf, BoxError> {
    let path = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?.with_file_name("queen-broker"),
    };
    if !path.exists() {
        return Err(format!(
            "broker binary {} not found: build it with `cargo build --release --bins` (same target directory as the bench) or pass --broker-bin",
            path.display()
        )
        .into());
    }
    Ok(path)
}

impl BrokerProcess {
    /// Starts the broker on a free port against `database_url` and waits until `/health` says
    /// it is ready. `extra_env` overrides the broker's settings (e.g. `QUEEN_COMMITTERS=8`).
    ///
    /// # Errors
    ///
    /// When the process does not start or does not become ready within 30 s.
    pub async fn start(
        bin: &Path,
        database_url: &str,
        extra_env: &[(String, String)],
    ) -> Result<Self, BoxError> {
        let port = queen_broker::pg::free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "queen-bench-broker-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join("spool"))?;
        let log = std::fs::File::create(dir.join("broker.log"))?;
        let mut cmd = Command::new(bin);
        cmd.current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("HOST", "127.0.0.1")
            .env("PORT", port.to_string())
            .env("FILE_BUFFER_DIR", dir.join("spool"))
            .env("LOG_LEVEL", "warn")
            .env("QUEEN_CONFIG", dir.join("no-config.toml"));
        // An absent QUEEN_CONFIG file would be an error; an empty one is a valid empty table.
        std::fs::write(dir.join("no-config.toml"), "")?;
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut broker = Self { child, port, dir };
        broker.wait_ready().await?;
        Ok(broker)
    }

    async fn wait_ready(&mut self) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = HttpConn::new(self.port);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(
                    format!("broker exited at start ({status}): {}", self.log_tail()).into(),
                );
            }
            if let Ok(r) = conn.request("GET", "/health", b"").await {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("broker not ready after 30 s: {}", self.log_tail()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the broker's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// The broker's whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }

    /// Lines of the broker's log that are warnings or errors (at most `max`).
    pub fn log_problems(&self, max: usize) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(max)
            .map(str::to_string)
            .collect()
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 10 s) and removes its folder.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
