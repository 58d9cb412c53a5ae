//! A failover decided by Patroni with etcd (`tests/it/support/patroni.rs`: a single-node etcd
//! and two Patroni nodes made by the test), in `synchronous_mode` or with plain asynchronous
//! streaming replication. The workload and the checks are those of tests/it/ha_failover.rs
//! (`engine_failover` in `tests/it/support/load.rs`): two brokers on the multi-host URL, four
//! producers and an acking consumer; mid-load the leader's machine dies (its patroni, its
//! PostgreSQL and every backend SIGKILLed). Its leader key expires in etcd, the replica takes
//! the key and promotes itself; the brokers spool meanwhile, find the new primary among the
//! hosts and replay.
//!
//! With `synchronous_mode`: lost = 0, twice = 0, order = 0, every accepted message delivered
//! and acked, nothing delivered again after its ack. Asynchronous: what the promotion lost is
//! printed (the window), with the replication lag sampled on the leader during the load, and
//! only twice = 0 and order = 0 are asserted. Skips when patroni or etcd is not installed,
//! unless `QUEEN_REQUIRE_HA=1` (`.ci/run`). `cargo test --test it ha_patroni -- --nocapture`
//! prints the numbers.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::support::load::{
    assert_at_most_once_in_order, assert_nothing_lost, engine_failover, Outcome,
};
use crate::support::patroni::PatroniCluster;

/// The leader's WAL not yet flushed by the replica, in bytes, sampled every 100 ms while the
/// leader answers: the largest sample and the last one before it died.
#[derive(Default, Clone, Copy)]
struct Lag {
    max: i64,
    last: i64,
    samples: usize,
}

/// Samples `pg_current_wal_lsn() - flush_lsn` of the replica `n2` on the leader at `url` until
/// the leader stops answering.
async fn sample_lag(url: String, lag: Rc<Cell<Lag>>) {
    let Ok(mut conn) = PgConnection::connect(&url).await else {
        return;
    };
    loop {
        let behind: Result<Option<i64>, _> = sqlx::query_scalar(
            "SELECT (pg_current_wal_lsn() - flush_lsn)::bigint
               FROM pg_stat_replication
              WHERE application_name = 'n2'",
        )
        .fetch_optional(&mut conn)
        .await
        .map(Option::flatten);
        let Ok(behind) = behind else {
            return;
        };
        let mut l = lag.get();
        let behind = behind.unwrap_or(0);
        l.max = l.max.max(behind);
        l.last = behind;
        l.samples += 1;
        lag.set(l);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two brokers under load on a Patroni cluster whose leader then dies; `None` when patroni or
/// etcd is not installed (and not required).
async fn run(synchronous: bool) -> Option<Outcome> {
    let mut cluster = PatroniCluster::start(synchronous).await?;
    let url = cluster.url("queen");
    let old = format!("127.0.0.1:{}", cluster.ports[0]);
    let new = format!("127.0.0.1:{}", cluster.ports[1]);
    let promoted = cluster.node_url(1, "queen");
    let lag = Rc::new(Cell::new(Lag::default()));
    let sampler = actix_web::rt::spawn(sample_lag(cluster.node_url(0, "postgres"), lag.clone()));
    let run = engine_failover(&url, &old, &new, || cluster.kill_node(0), promoted).await;
    sampler.abort();
    let lag = lag.get();
    eprintln!(
        "ha failover (Patroni + etcd, {}): {}; replica behind the leader's WAL (bytes, \
         {} samples): max {}, last before the kill {}; members: {:?}",
        if synchronous {
            "synchronous_mode"
        } else {
            "asynchronous"
        },
        run.describe(),
        lag.samples,
        lag.max,
        lag.last,
        cluster.members().await
    );
    Some(run.outcome)
}

#[actix_web::test]
async fn patroni_in_synchronous_mode_loses_nothing_when_the_leader_dies() {
    let Some(run) = run(true).await else {
        return;
    };
    assert_nothing_lost(&run);
}

#[actix_web::test]
async fn patroni_with_an_asynchronous_replica_is_measured() {
    let Some(run) = run(false).await else {
        return;
    };
    assert_at_most_once_in_order(&run);
}
