//! A failover decided by a real HA engine: pg_auto_failover (a monitor and two nodes,
//! `tests/it/support/autofailover.rs`), the standby synchronous as pg_auto_failover sets it up
//! by default, or asynchronous (`--replication-quorum false`).
//! Two brokers on the multi-host URL, four producers and an acking consumer (the workload of
//! `tests/it/support/load.rs`). Mid-load the primary's machine dies: its pg_autoctl, its
//! PostgreSQL and every backend are SIGKILLed. The monitor notices, promotes the standby and
//! turns synchronous replication off on it (no standby left); the brokers spool what arrives
//! meanwhile, find the new primary among the hosts and replay.
//!
//! Checked on PostgreSQL at the end, as in tests/it/switchover.rs. With the synchronous
//! standby: lost = 0, twice = 0, order = 0, every accepted message delivered and acked, nothing
//! delivered again after its ack. With the asynchronous one, what the promotion lost is printed
//! (the window) and only twice = 0 and order = 0 are asserted. Skips when pg_autoctl is not installed, unless `QUEEN_REQUIRE_HA=1` (`.ci/run`).
//! `cargo test --test it ha_failover -- --nocapture` prints the numbers.

use crate::support::autofailover::Formation;
use crate::support::load::{
    assert_at_most_once_in_order, assert_nothing_lost, engine_failover, Outcome,
};

/// Two brokers under load on a formation whose primary then dies; `None` when pg_autoctl is
/// not installed (and not required).
async fn run(synchronous: bool) -> Option<Outcome> {
    let mut formation = Formation::start(synchronous).await?;
    let url = formation.url("queen");
    let old = format!("127.0.0.1:{}", formation.ports[0]);
    let new = format!("127.0.0.1:{}", formation.ports[1]);
    let promoted = formation.node_url(1, "queen");
    let run = engine_failover(&url, &old, &new, || formation.kill_node(0), promoted).await;
    eprintln!(
        "ha failover (pg_auto_failover, {} standby): {}; monitor: {:?}",
        if synchronous {
            "synchronous"
        } else {
            "asynchronous"
        },
        run.describe(),
        formation.states().await
    );
    Some(run.outcome)
}

#[actix_web::test]
async fn pg_auto_failover_with_a_synchronous_standby_loses_nothing_when_the_primary_dies() {
    let Some(run) = run(true).await else {
        return;
    };
    assert_nothing_lost(&run);
}

#[actix_web::test]
async fn pg_auto_failover_with_an_asynchronous_standby_is_measured() {
    let Some(run) = run(false).await else {
        return;
    };
    assert_at_most_once_in_order(&run);
}
