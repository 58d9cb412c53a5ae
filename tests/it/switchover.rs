//! PostgreSQL going away under load, with producers and an acking consumer running through it:
//!
//! - `a_primary_switchover_loses_nothing`: two brokers on a multi-host URL (a primary and its
//!   streaming standby made by `pg_basebackup -R` in the test; one broker lists the standby
//!   first, so it must pick the primary at start). Mid-load the primary is made
//!   read-only (writes fail with SQLSTATE 25006) and its sessions are ended, the standby
//!   catches up and is promoted (`pg_ctl promote`), the old primary is stopped. The brokers
//!   spool what arrives meanwhile (`buffered`), find the new primary among the hosts, replay,
//!   and the consumer goes on.
//! - `a_failover_with_synchronous_replication_loses_nothing`: the same pair with synchronous
//!   replication; mid-load the primary crashes (`pg_ctl stop -m immediate`, nothing fenced
//!   gracefully, no catch-up awaited) and the standby is promoted with what it has, as an HA
//!   engine does. Every commit answered `queued` had reached the standby: lost = 0.
//! - `a_failover_with_asynchronous_replication_is_measured`: the same crash with asynchronous
//!   replication, the case docs/reliability.md does not promise: it prints how many accepted
//!   messages and acks the promotion lost (the window) and asserts only what still holds
//!   (nothing twice, nothing out of order, the brokers carry on).
//! - `a_standby_promoted_without_fencing_is_followed_to_the_newer_timeline`: the standby is
//!   promoted while the old primary still takes writes (split brain). The brokers notice a
//!   second writable host on a newer timeline and switch to it; what they committed on the old
//!   primary in between is lost, and printed (the window), not asserted.
//! - `three_brokers_ride_through_a_postgresql_restart`: three brokers on one cluster that is
//!   crash-stopped (`pg_ctl stop -m immediate`) and started again mid-load.
//!
//! Both check on PostgreSQL at the end: per partition every produced key is stored (lost = 0),
//! once (twice = 0), in production order (order = 0); every message was acked, no message was
//! delivered again after its ack succeeded, and per partition acks came in key order. Producers
//! use deterministic transactionIds and retry a batch until every item is accepted (`queued`,
//! `buffered` or `duplicate`); each producer stays with one broker (order is promised per
//! broker: a `buffered` batch replays from that broker's spool). Each test prints its numbers
//! (`cargo test --test it switchover:: -- --nocapture`); each takes well under a minute.

use std::time::{Duration, Instant};

use queen_broker::pg::{free_port, PrivateCluster};
use uuid::Uuid;

use crate::support::load::{blocking, check_consumed, failover_brokers, ms, Load, Outcome};
use crate::support::replica::ReplicaPair;
use crate::support::{eventually, TestDb};

#[actix_web::test]
async fn a_primary_switchover_loses_nothing() {
    let pair = ReplicaPair::start();
    let mut apps = failover_brokers(&pair.url("postgres"), 1).await;
    // The second broker lists the standby first: it must start on the primary all the same.
    apps.extend(failover_brokers(&pair.url_standby_first("postgres"), 1).await);
    let old = format!("127.0.0.1:{}", pair.primary.port);
    let new = format!("127.0.0.1:{}", pair.standby.port);
    for app in &apps {
        assert_eq!(app.broker.primary.current_host(), old);
    }
    let load = Load::start(apps, 4).await;
    load.accepted_more(1_000).await;

    // The switchover: the old primary stops taking writes, the standby catches up and is
    // promoted, the old primary goes away.
    let before = load.tally.borrow().accepted;
    let gap_start = Instant::now();
    pair.make_primary_read_only().await;
    pair.standby_caught_up().await;
    // Writes are refused for a while (as while an operator or Patroni promotes): pushes
    // meanwhile must be answered `buffered`.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let promote_start = Instant::now();
    let standby = pair.standby.clone();
    blocking(move || standby.promote()).await;
    let promoted = load.watch_resume();
    let old_primary = pair.primary.clone();
    blocking(move || old_primary.stop(false)).await;
    let during_gap = load.tally.borrow().accepted - before;

    for app in load.apps.iter() {
        let (primary, new) = (&app.broker.primary, &new);
        eventually(
            Duration::from_secs(20),
            "the broker switches to the promoted standby",
            || async move { (primary.current_host() == *new).then_some(()) },
        )
        .await;
        // An operator sees it in the metrics: the host written to now, and one switch more.
        let (status, text) = app.get_text("/metrics/prometheus").await;
        assert_eq!(status, 200);
        assert!(
            text.contains(&format!("queen_database_primary{{host=\"{new}\"}} 1")),
            "{text}"
        );
        assert!(
            !text.contains("queen_database_primary_switches_total 0\n"),
            "no switch counted: {text}"
        );
    }
    load.resumed_after(promoted).await;
    load.accepted_more(1_000).await;
    let apps = load.apps.clone();
    let db = TestDb {
        url: pair.standby.url("postgres"),
    };
    let Outcome {
        total,
        elapsed,
        lost,
        twice,
        order,
        tally: t,
        lost_answers,
        unexplained,
    } = load.finish_checked(&db).await;
    let pushes_resumed = t.pushes_resumed_at.expect("pushes resumed");
    let pops_resumed = t.pops_resumed_at.expect("pops resumed");
    eprintln!(
        "switchover: {total} messages through 2 brokers in {:.1} s; writes refused for {} ms \
         (read-only to promoted, promote took {} ms); pushes queued again {} ms after the \
         promotion ({} ms after writes stopped), pops delivering {} ms after the promotion; \
         {} items buffered, {} accepted during the gap, {} push retries, {} pop errors; \
         {} deliveries, {} acked, {} acks refused ({} after their first attempt had committed); lost {lost}, twice {twice}, order {order}, delivered after \
         ack {}, switches {:?}",
        elapsed.as_secs_f64(),
        ms(promoted - gap_start),
        ms(promoted - promote_start),
        ms(pushes_resumed.saturating_duration_since(promoted)),
        ms(pushes_resumed - gap_start),
        ms(pops_resumed.saturating_duration_since(promoted)),
        t.buffered,
        during_gap,
        t.push_retries,
        t.pop_errors,
        t.deliveries,
        t.acked.len(),
        t.acks_refused,
        lost_answers,
        t.after_ack,
        apps.iter()
            .map(|a| a.broker.primary.switches())
            .collect::<Vec<_>>(),
    );
    assert_eq!((lost, twice, order), (0, 0, 0));
    check_consumed(&t, &unexplained);
    assert!(
        t.buffered > 0,
        "pushes during the gap were spooled (answered buffered)"
    );
    // One switch each at the switchover; the broker that listed the standby first also
    // switched once at start.
    let switches: Vec<u64> = apps.iter().map(|a| a.broker.primary.switches()).collect();
    assert_eq!(switches, [1, 2]);
    for app in apps.iter() {
        assert_eq!(app.broker.state.spool.state.records(), 0);
    }
}

/// Two brokers on the pair under load; the primary crashes and the standby is promoted at once.
/// Prints the run's numbers.
async fn failover(synchronous: bool) -> Outcome {
    use queen_broker::storage::cluster::durability::{self, Level};
    let pair = ReplicaPair::start();
    pair.streaming().await;
    if synchronous {
        pair.make_synchronous().await;
    }
    // What the broker logs at start about these settings: the asynchronous standby is named
    // as a risk, the synchronous one is not.
    let settings = durability::read(
        &mut TestDb {
            url: pair.primary.url("postgres"),
        }
        .conn()
        .await,
    )
    .await
    .expect("durability settings");
    assert_eq!(settings.standbys, 1, "{settings:?}");
    assert_eq!(
        settings.sync_standbys,
        i64::from(synchronous),
        "{settings:?}"
    );
    let warned = settings
        .findings()
        .iter()
        .any(|(level, text)| *level == Level::Warn && text.contains("replicate asynchronously"));
    assert_eq!(warned, !synchronous, "{:?}", settings.findings());

    let apps = failover_brokers(&pair.url("postgres"), 2).await;
    let new = format!("127.0.0.1:{}", pair.standby.port);
    let load = Load::start(apps, 4).await;
    load.accepted_more(1_000).await;

    // The failure: the primary dies mid-commit; the standby is promoted with what it has.
    let crash_at = Instant::now();
    let old_primary = pair.primary.clone();
    blocking(move || old_primary.stop(true)).await;
    let standby = pair.standby.clone();
    blocking(move || standby.promote()).await;
    let promoted = load.watch_resume();
    load.all_on(&new, Duration::from_secs(20)).await;
    load.resumed_after(promoted).await;
    load.accepted_more(1_000).await;
    let apps = load.apps.clone();
    let db = TestDb {
        url: pair.standby.url("postgres"),
    };
    let Outcome {
        total,
        elapsed,
        lost,
        twice,
        order,
        tally: t,
        lost_answers,
        unexplained,
    } = load.finish_checked(&db).await;
    let pushes_resumed = t.pushes_resumed_at.expect("pushes resumed");
    eprintln!(
        "failover ({} replication): {total} messages through 2 brokers in {:.1} s; crash to \
         promoted {} ms; pushes queued again {} ms after the promotion, pops delivering {} ms \
         after it; {} items buffered, {} push retries, {} pop errors; {} deliveries, {} acked, \
         {} acks refused ({} after their first attempt had committed); lost {lost}, twice \
         {twice}, order {order}, not delivered and acked {}, delivered after ack {}",
        if synchronous {
            "synchronous"
        } else {
            "asynchronous"
        },
        elapsed.as_secs_f64(),
        ms(promoted - crash_at),
        ms(pushes_resumed.saturating_duration_since(promoted)),
        ms(t.pops_resumed_at
            .expect("pops resumed")
            .saturating_duration_since(promoted)),
        t.buffered,
        t.push_retries,
        t.pop_errors,
        t.deliveries,
        t.acked.len(),
        t.acks_refused,
        lost_answers,
        unexplained.len(),
        t.after_ack,
    );
    for app in apps.iter() {
        assert_eq!(app.broker.state.spool.state.records(), 0, "spools drained");
    }
    Outcome {
        total,
        elapsed,
        lost,
        twice,
        order,
        tally: t,
        lost_answers,
        unexplained,
    }
}

#[actix_web::test]
async fn a_failover_with_synchronous_replication_loses_nothing() {
    let run = failover(true).await;
    assert!(run.total >= 2_000);
    assert_eq!((run.lost, run.twice, run.order), (0, 0, 0));
    check_consumed(&run.tally, &run.unexplained);
}

#[actix_web::test]
async fn a_failover_with_asynchronous_replication_is_measured() {
    // What asynchronous replication still promises: a message is stored at most once and in
    // order, and the brokers go on with the promoted standby (checked inside). How many
    // accepted messages the promotion lost is printed, not asserted: that is the window.
    let run = failover(false).await;
    assert!(run.total >= 2_000);
    assert_eq!((run.twice, run.order), (0, 0));
    assert_eq!(
        run.tally.ack_order, 0,
        "per partition, acks follow key order"
    );
}

#[actix_web::test]
async fn a_standby_promoted_without_fencing_is_followed_to_the_newer_timeline() {
    let pair = ReplicaPair::start();
    pair.streaming().await;
    let apps = failover_brokers(&pair.url("postgres"), 2).await;
    let new = format!("127.0.0.1:{}", pair.standby.port);
    let load = Load::start(apps, 4).await;
    load.accepted_more(1_000).await;

    // The mistake: the standby is promoted while the old primary goes on taking writes.
    let standby = pair.standby.clone();
    blocking(move || standby.promote()).await;
    let promoted = Instant::now();
    load.all_on(&new, Duration::from_secs(20)).await;
    let followed = promoted.elapsed();
    // The operator fences the old primary afterwards.
    let old_primary = pair.primary.clone();
    blocking(move || old_primary.stop(false)).await;
    load.accepted_more(1_000).await;
    let apps = load.apps.clone();
    let db = TestDb {
        url: pair.standby.url("postgres"),
    };
    let Outcome {
        total,
        elapsed,
        lost,
        twice,
        order,
        tally: t,
        ..
    } = load.finish_checked(&db).await;
    eprintln!(
        "split brain: {total} messages through 2 brokers in {:.1} s; both brokers on the newer \
         timeline {} ms after the promotion; lost {lost} (committed on the old primary in that \
         window), twice {twice}, order {order}, delivered again after an ack {} (acks made on \
         the old primary), switches {:?}",
        elapsed.as_secs_f64(),
        ms(followed),
        t.after_ack,
        apps.iter()
            .map(|a| a.broker.primary.switches())
            .collect::<Vec<_>>(),
    );
    assert_eq!((twice, order), (0, 0));
    for app in apps.iter() {
        assert_eq!(
            app.broker.primary.switches(),
            1,
            "one switch, to the newer timeline"
        );
        assert_eq!(app.broker.state.spool.state.records(), 0, "spools drained");
    }
}

#[actix_web::test]
async fn three_brokers_ride_through_a_postgresql_restart() {
    let dir = std::env::temp_dir().join(format!("queen-restart-{}", Uuid::new_v4().simple()));
    let cluster =
        PrivateCluster::new(&dir.join("pg"), free_port().expect("port")).expect("server binaries");
    cluster.start(true).expect("cluster starts");
    struct Cleanup(PrivateCluster, std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = self.0.stop(true);
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _cleanup = Cleanup(cluster.clone(), dir);
    let db = TestDb {
        url: cluster.url("postgres"),
    };
    let apps = failover_brokers(&db.url, 3).await;
    let load = Load::start(apps, 6).await;
    load.accepted_more(1_000).await;

    let down_at = Instant::now();
    let pg = cluster.clone();
    blocking(move || pg.stop(true)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let pg = cluster.clone();
    blocking(move || pg.start(true)).await;
    let restarted = load.watch_resume();
    load.resumed_after(restarted).await;
    load.accepted_more(1_000).await;
    let Outcome {
        total,
        elapsed,
        lost,
        twice,
        order,
        tally: t,
        lost_answers,
        unexplained,
    } = load.finish_checked(&db).await;
    eprintln!(
        "restart: {total} messages through 3 brokers in {:.1} s; PostgreSQL down {} ms; pushes \
         queued again {} ms after the restart; {} items buffered, {} push retries, {} pop errors; \
         {} deliveries, {} acked, {} acks refused ({} after their first attempt had committed); lost {lost}, twice {twice}, order {order}, \
         delivered after ack {}",
        elapsed.as_secs_f64(),
        ms(restarted - down_at),
        ms(t.pushes_resumed_at
            .expect("resumed")
            .saturating_duration_since(restarted)),
        t.buffered,
        t.push_retries,
        t.pop_errors,
        t.deliveries,
        t.acked.len(),
        t.acks_refused,
        lost_answers,
        t.after_ack,
    );
    assert_eq!((lost, twice, order), (0, 0, 0));
    check_consumed(&t, &unexplained);
    assert!(
        t.buffered > 0,
        "pushes while PostgreSQL was down were spooled"
    );
}
