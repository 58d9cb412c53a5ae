//! No record holds back the others: a commit refused for a reason other than PostgreSQL being
//! unreachable is retried segment by segment (live path) and item by item with a quarantine
//! (replay); and first-wins holds inside a body on the spool path. Against a fake store whose
//! "poisoned" payloads are refused.

#[allow(dead_code)] // support is shared with write_path, which uses all of it
mod support;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use broker_actors::committer::{CommitterLimits, CommitterPool, SegmentReady};
use broker_actors::partition::PartitionLimits;
use broker_actors::registry::Registry;
use broker_actors::spool::replay::Replayer;
use broker_actors::spool::{quarantine, record, SpoolActor, SpoolHandle, SpoolState};
use broker_actors::store::SegmentWrite;
use broker_actors::{PartitionKey, Verdict};
use support::{committer, gated_store, item, items, open_store, seg, TempSpool};
use tokio::sync::oneshot;

fn submit(
    pool: &CommitterPool,
    partition: &str,
    payloads: &[&str],
) -> oneshot::Receiver<broker_actors::committer::SegmentResult> {
    let (reply, outcome) = oneshot::channel();
    pool.submit(SegmentReady {
        write: SegmentWrite {
            key: PartitionKey::new("q", partition),
            partition_id: None,
            items: items(payloads),
        },
        reply,
    });
    outcome
}

#[actix::test]
async fn segments_that_merely_shared_a_refused_commit_are_committed_on_their_own() {
    let (store, mut probe) = gated_store();
    probe.poison("bad");
    let pool = CommitterPool::new(
        vec![committer(0, store, CommitterLimits::default())],
        usize::MAX,
    );
    let first = submit(&pool, "p1", &["a"]);
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&PartitionKey::new("q", "p1"), &["a"])]
    );
    // These two wait behind the first transaction and leave together in the next one.
    let poisoned = submit(&pool, "p2", &["bad"]);
    let innocent = submit(&pool, "p3", &["c1", "c2"]);
    probe.release(10);
    let (p2, p3) = (PartitionKey::new("q", "p2"), PartitionKey::new("q", "p3"));
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&p2, &["bad"]), seg(&p3, &["c1", "c2"])]
    );
    assert!(first.await.unwrap().is_ok());
    let refused = poisoned
        .await
        .unwrap()
        .expect_err("the poisoned segment fails");
    assert!(refused.error.to_string().contains("invalid byte sequence"));
    assert_eq!(refused.items.len(), 1);
    let fine = innocent
        .await
        .unwrap()
        .expect("the innocent segment is committed on its own");
    assert_eq!(fine.verdicts, vec![Verdict::Queued; 2]);
    let commits = probe.commits();
    assert_eq!(
        commits.len(),
        4,
        "the whole batch, then each segment alone: {commits:?}"
    );
    assert_eq!(commits[3], vec![seg(&p3, &["c1", "c2"])]);
}

#[actix::test]
async fn replay_quarantines_a_refused_record_and_the_rest_go_on_in_order() {
    let (store, probe) = open_store();
    probe.poison("bad");
    let spool = TempSpool::open();
    let key = PartitionKey::new("q", "p");
    let other = PartitionKey::new("q", "o");
    // A spool file as an earlier run left it: a, bad, b on one partition, c on another.
    let mut bytes = Vec::new();
    let poisoned = item("bad");
    for (k, i) in [
        (&key, item("a")),
        (&key, poisoned.clone()),
        (&other, item("c")),
        (&key, item("b")),
    ] {
        record::encode(k, &i, &mut bytes);
    }
    std::fs::write(
        spool.dir.join("spool-00000000000000000001-000001.qspool"),
        &bytes,
    )
    .unwrap();
    // Reopen the spool over that file, as a restart does.
    let state = Arc::new(SpoolState::default());
    let actor = SpoolActor::open(&spool.dir, state.clone()).unwrap().start();
    assert_eq!(state.records(), 4);
    let handle = SpoolHandle {
        actor: actor.clone(),
        state: state.clone(),
    };
    Replayer::new(
        store,
        actor,
        state.clone(),
        Duration::from_millis(10),
        Duration::from_millis(10),
    )
    .start();
    support_wait(|| state.records() == 0, "the spool drains").await;
    assert_eq!(state.quarantined(), 1);
    let listed = quarantine::list(&spool.dir, 0, 10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["messageId"], poisoned.message_id.to_string());
    assert_eq!(listed[0]["payload"], "bad");
    assert!(listed[0]["error"]
        .as_str()
        .unwrap()
        .contains("invalid byte sequence"));
    // Everything else was committed, each partition in file order.
    let committed: Vec<(PartitionKey, String)> = probe
        .commits()
        .into_iter()
        .flatten()
        .flat_map(|(k, ps)| ps.into_iter().map(move |p| (k.clone(), p)))
        .collect();
    let last_ok = committed.iter().rposition(|(_, p)| p == "a").unwrap();
    let after: Vec<&str> = committed[last_ok..]
        .iter()
        .filter(|(k, p)| *k == key && p != "bad")
        .map(|(_, p)| p.as_str())
        .collect();
    assert_eq!(
        after,
        ["a", "b"],
        "b follows a on its partition: {committed:?}"
    );
    assert!(committed.iter().any(|(k, p)| *k == other && p == "c"));
    // A restart counts the quarantine again.
    let again = Arc::new(SpoolState::default());
    let _reopened = SpoolActor::open(&spool.dir, again.clone()).unwrap();
    assert_eq!(again.quarantined(), 1);
    assert_eq!(again.records(), 0);
    drop(handle);
}

async fn support_wait(mut done: impl FnMut() -> bool, what: &str) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[actix::test]
async fn first_wins_inside_a_body_on_the_spool_path() {
    let (store, probe) = open_store();
    let spool = TempSpool::open();
    spool.handle.state.set_maintenance(true);
    let pool = CommitterPool::new(
        vec![committer(0, store, CommitterLimits::default())],
        usize::MAX,
    );
    let registry = Registry::new(
        vec![Arbiter::current()],
        pool,
        PartitionLimits::default(),
        Some(spool.handle.clone()),
    );
    let key = PartitionKey::new("q", "p");
    let mut body = items(&["t1", "t2"]);
    let mut repeat = item("t1");
    repeat.payload = "second".into();
    body.insert(1, repeat);
    let first_id = body[0].message_id;
    let verdicts = registry.push(&key, body).await.expect("answered");
    assert_eq!(
        verdicts,
        vec![
            Verdict::Buffered,
            Verdict::Duplicate(first_id),
            Verdict::Buffered
        ]
    );
    assert_eq!(spool.handle.state.records(), 2, "the repeat is not spooled");
    let files = broker_actors::spool::list_files(&spool.dir).unwrap();
    let (records, _) = record::decode_all(&std::fs::read(&files[0]).unwrap());
    let payloads: Vec<&str> = records.iter().map(|r| &*r.item.payload).collect();
    assert_eq!(payloads, ["t1", "t2"]);
    assert!(probe.commits().is_empty());
}
