//! A database node's machine dying, for the HA engine tests (`autofailover.rs`, `patroni.rs`):
//! the engine's agent and every PostgreSQL process of that node SIGKILLed, nothing shut down
//! cleanly. Only the PIDs of that node are ever signalled: its postmaster (read from its
//! `postmaster.pid`), that postmaster's children, and the agent's own process group.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The node's machine dies. PostgreSQL's children lead process groups of their own and outlive
/// a killed postmaster until they notice: the postmaster is stopped first (no new children),
/// its children killed, then the agent's process group (`agent` leads it) and the postmaster.
pub fn kill_machine(pgdata: &Path, agent: &mut Child) {
    let postmaster = postmaster_pid(pgdata);
    if let Some(pid) = postmaster {
        signal(pid, "STOP");
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &pid.to_string()])
            .status();
    }
    kill_group(agent.id());
    let _ = agent.wait();
    if let Some(pid) = postmaster {
        signal(pid, "KILL");
    }
}

/// SIGKILL to a process group. Spelled `kill -s KILL -- -PGID`: procps-ng 4.0.2 (Debian 12)
/// reads `kill -9 -PGID` as `kill(-1, SIGKILL)`, which kills every process it may.
pub fn kill_group(pgid: u32) {
    assert!(pgid > 1, "not a process group of ours: {pgid}");
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{pgid}")])
        .status();
}

/// `kill -s SIG -- PID` for one process.
fn signal(pid: u32, sig: &str) {
    assert!(pid > 1, "not a process of ours: {pid}");
    let _ = Command::new("kill")
        .args(["-s", sig, "--", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The postmaster's PID, from the first line of `postmaster.pid`.
fn postmaster_pid(pgdata: &Path) -> Option<u32> {
    std::fs::read_to_string(pgdata.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// A shell that waits for this test process to end, however it ends, then runs `cleanup`
/// (stopping an HA engine's processes and servers, removing its folder). It outlives this
/// process on purpose; init reaps it.
pub fn watchdog(cleanup: &str) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {cleanup}",
        pid = std::process::id()
    );
    #[expect(
        clippy::zombie_processes,
        reason = "the watchdog outlives this process on purpose; init reaps it"
    )]
    let _watchdog = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("watchdog starts");
}
