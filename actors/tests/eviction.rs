//! Evicting partition actors (no PostgreSQL): the registry stays within `max_actors` by
//! evicting the least recently used idle actors, and evicts actors idle for `idle_after`; an
//! evicted partition's next push starts a fresh actor, and per-partition order and dedup are
//! what they were. The store here keeps what PostgreSQL keeps for the broker (offsets per
//! partition, the transactionIds seen), so a write that skipped or reordered anything, or an
//! actor that forgot to look its partition up again, shows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use broker_actors::committer::{Committer, CommitterLimits, CommitterPool};
use broker_actors::error::StoreError;
use broker_actors::partition::{PartitionLimits, Push};
use broker_actors::registry::Registry;
use broker_actors::store::{SegmentOutcome, SegmentStore, SegmentWrite};
use broker_actors::{Item, PartitionKey, Verdict};
use tokio::sync::{oneshot, Semaphore};
use uuid::Uuid;

/// One partition as the store holds it.
#[derive(Default)]
struct Partition {
    id: i64,
    /// transactionIds in offset order.
    log: Vec<String>,
    /// transactionId → message id of the stored original.
    seen: HashMap<String, Uuid>,
    /// Writes that arrived without the partition's id (a fresh actor's first write).
    lookups: usize,
}

#[derive(Default)]
struct Ledger {
    partitions: HashMap<PartitionKey, Partition>,
}

/// A store with PostgreSQL's part of the contract: offsets in commit order, dedup by
/// transactionId (a duplicate names the original and writes nothing), a stable partition id.
/// With a gate, each commit waits for a permit the test gives.
#[derive(Clone)]
struct LedgerStore {
    ledger: Arc<Mutex<Ledger>>,
    gate: Option<Arc<Semaphore>>,
}

impl SegmentStore for LedgerStore {
    async fn commit(&mut self, batch: &[SegmentWrite]) -> Result<Vec<SegmentOutcome>, StoreError> {
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("never closed").forget();
        }
        let mut ledger = self.ledger.lock().unwrap();
        let next_id = ledger.partitions.len() as i64 + 1;
        let mut out = Vec::new();
        for write in batch {
            let p = ledger.partitions.entry(write.key.clone()).or_default();
            if p.id == 0 {
                p.id = next_id;
            }
            match write.partition_id {
                None => p.lookups += 1,
                Some(id) => assert_eq!(id, p.id, "an actor kept a wrong partition id"),
            }
            let mut verdicts = Vec::new();
            for item in &write.items {
                match p.seen.get(&item.transaction_id) {
                    Some(original) => verdicts.push(Verdict::Duplicate(*original)),
                    None => {
                        p.seen.insert(item.transaction_id.clone(), item.message_id);
                        p.log.push(item.transaction_id.clone());
                        verdicts.push(Verdict::Queued);
                    }
                }
            }
            out.push(SegmentOutcome {
                partition_id: p.id,
                verdicts,
            });
        }
        Ok(out)
    }
}

impl LedgerStore {
    fn new(gate: Option<Arc<Semaphore>>) -> Self {
        Self {
            ledger: Arc::default(),
            gate,
        }
    }

    fn log(&self, key: &PartitionKey) -> Vec<String> {
        let ledger = self.ledger.lock().unwrap();
        ledger
            .partitions
            .get(key)
            .map(|p| p.log.clone())
            .unwrap_or_default()
    }

    fn lookups(&self, key: &PartitionKey) -> usize {
        let ledger = self.ledger.lock().unwrap();
        ledger.partitions.get(key).map_or(0, |p| p.lookups)
    }
}

fn item(txn: &str) -> Item {
    Item {
        message_id: Uuid::now_v7(),
        transaction_id: txn.to_string(),
        payload: format!("\"{txn}\"").into(),
        producer_sub: None,
        trace_id: None,
        arrived_at_micros: 1_700_000_000_000_000,
    }
}

fn key(p: &str) -> PartitionKey {
    PartitionKey::new("q", p)
}

/// A registry whose actors run on `arbiters`, writing through one committer over `store`.
fn registry(store: LedgerStore, limits: PartitionLimits, arbiters: Vec<ArbiterHandle>) -> Registry {
    let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let committer = Committer::new(0, store, load.clone(), CommitterLimits::default()).start();
    let pool = CommitterPool::new(vec![(committer.recipient(), load)], usize::MAX);
    Registry::new(arbiters, pool, limits, None)
}

fn limits(max_actors: usize, idle_after: Duration) -> PartitionLimits {
    PartitionLimits {
        max_actors,
        idle_after,
        ..PartitionLimits::default()
    }
}

#[actix::test]
async fn a_full_registry_evicts_the_least_recently_used_and_its_next_push_still_works() {
    let store = LedgerStore::new(None);
    let registry = registry(
        store.clone(),
        limits(2, Duration::from_secs(3600)),
        vec![Arbiter::current()],
    );
    for (p, txn) in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1")] {
        let v = registry.push(&key(p), vec![item(txn)]).await.unwrap();
        assert_eq!(v, vec![Verdict::Queued]);
    }
    // a was used after b, so b (the least recently used) made room for c.
    assert_eq!(registry.len(), 2);
    assert_eq!(registry.evicted(), 1);
    assert_eq!(store.lookups(&key("b")), 1);

    // b's next push starts a fresh actor, which looks its partition up again; offsets go on.
    let v = registry
        .push(&key("b"), vec![item("b2"), item("b3")])
        .await
        .unwrap();
    assert_eq!(v, vec![Verdict::Queued, Verdict::Queued]);
    assert_eq!(store.log(&key("b")), vec!["b1", "b2", "b3"]);
    assert_eq!(store.lookups(&key("b")), 2, "a fresh actor, a fresh lookup");
    assert_eq!(registry.len(), 2);

    // Dedup is the store's, so it survives the eviction: b1 again names the original.
    let original = {
        let ledger = store.ledger.lock().unwrap();
        ledger.partitions[&key("b")].seen["b1"]
    };
    let v = registry.push(&key("b"), vec![item("b1")]).await.unwrap();
    assert_eq!(v, vec![Verdict::Duplicate(original)]);
    assert_eq!(store.log(&key("b")), vec!["b1", "b2", "b3"]);
    assert_eq!(store.log(&key("a")), vec!["a1", "a2"]);
}

#[actix::test]
async fn an_actor_with_a_write_in_flight_is_not_evicted_and_keeps_its_order() {
    let gate = Arc::new(Semaphore::new(0));
    let store = LedgerStore::new(Some(gate.clone()));
    let registry = registry(
        store.clone(),
        limits(1, Duration::from_secs(3600)),
        vec![Arbiter::current()],
    );
    // a's first write is in flight (held in the store) and no push is on its way to a: only
    // the actor's own count keeps it from being evicted.
    let a = registry.actor(&key("a"));
    let (reply, first) = oneshot::channel();
    a.send(Push {
        items: vec![item("a1")],
        reply,
    })
    .await
    .expect("the actor is alive")
    .expect("the actor took the push");
    // b arrives while a is busy: the registry goes over its bound rather than evict a.
    let r = registry.clone();
    let other = actix::spawn(async move { r.push(&key("b"), vec![item("b1")]).await });
    while registry.len() < 2 && registry.evicted() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(registry.evicted(), 0, "a busy actor is never evicted");
    // A second push to a reaches the same actor and waits behind the write in flight.
    let r = registry.clone();
    let second = actix::spawn(async move { r.push(&key("a"), vec![item("a2")]).await });
    gate.add_permits(100);
    assert_eq!(first.await.unwrap().unwrap(), vec![Verdict::Queued]);
    assert_eq!(second.await.unwrap().unwrap(), vec![Verdict::Queued]);
    assert_eq!(other.await.unwrap().unwrap(), vec![Verdict::Queued]);
    assert_eq!(store.log(&key("a")), vec!["a1", "a2"]);
    assert_eq!(store.lookups(&key("a")), 1, "one actor wrote both");
    assert_eq!(registry.evicted(), 0);

    // Settled: the next new partition brings the registry back to its bound.
    registry.push(&key("c"), vec![item("c1")]).await.unwrap();
    assert_eq!(registry.len(), 1);
    assert_eq!(registry.evicted(), 2);
    assert_eq!(
        registry.push(&key("a"), vec![item("a3")]).await.unwrap(),
        vec![Verdict::Queued]
    );
    assert_eq!(store.log(&key("a")), vec!["a1", "a2", "a3"]);
}

#[actix::test]
async fn idle_actors_are_evicted_and_the_partition_goes_on_where_it_was() {
    let store = LedgerStore::new(None);
    let registry = registry(
        store.clone(),
        limits(usize::MAX, Duration::from_millis(20)),
        vec![Arbiter::current()],
    );
    let first = item("t1");
    let original = first.message_id;
    registry.push(&key("p"), vec![first]).await.unwrap();
    assert_eq!(registry.len(), 1);
    // The sweeper runs every 10 ms here; give it up to 5 s on a busy machine.
    for _ in 0..500 {
        if registry.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(registry.is_empty(), "the idle actor was evicted");
    assert_eq!(registry.evicted(), 1);
    let v = registry
        .push(&key("p"), vec![item("t1"), item("t2")])
        .await
        .unwrap();
    assert_eq!(v, vec![Verdict::Duplicate(original), Verdict::Queued]);
    assert_eq!(store.log(&key("p")), vec!["t1", "t2"]);
    assert_eq!(store.lookups(&key("p")), 2);
}

/// Many producers, each pushing its own sequence to its own partitions, through a registry
/// bounded far below the number of partitions, on two actor threads: evictions race pushes all
/// the time. Every push must be answered `queued` and every partition must hold each
/// producer's items exactly once, in the order sent.
#[actix::test]
async fn pushes_racing_evictions_lose_nothing_and_keep_order() {
    const PRODUCERS: usize = 8;
    const PARTITIONS: usize = 40;
    const PUSHES: usize = 60;
    let store = LedgerStore::new(None);
    let arbiters = vec![Arbiter::new(), Arbiter::new()];
    let registry = registry(
        store.clone(),
        limits(3, Duration::from_secs(3600)),
        arbiters.iter().map(Arbiter::handle).collect(),
    );
    let mut tasks = Vec::new();
    for producer in 0..PRODUCERS {
        let registry = registry.clone();
        tasks.push(actix::spawn(async move {
            for n in 0..PUSHES {
                // Producers share partitions: partition (producer + n) mod PARTITIONS.
                let p = format!("p{}", (producer * 7 + n) % PARTITIONS);
                let txns = [format!("{producer}-{n}-0"), format!("{producer}-{n}-1")];
                let v = registry
                    .push(&key(&p), txns.iter().map(|t| item(t)).collect())
                    .await
                    .unwrap_or_else(|e| panic!("push {producer}/{n} to {p}: {e}"));
                assert_eq!(v, vec![Verdict::Queued, Verdict::Queued]);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(registry.evicted() > 0, "the bound forced evictions");
    assert!(
        registry.len() <= 3 + PRODUCERS,
        "bounded: {}",
        registry.len()
    );
    let mut total = 0;
    for p in 0..PARTITIONS {
        let log = store.log(&key(&format!("p{p}")));
        total += log.len();
        // Per producer, the items of this partition in the order that producer sent them.
        let mut last: HashMap<usize, (usize, usize)> = HashMap::new();
        for txn in &log {
            let parts: Vec<usize> = txn.split('-').map(|x| x.parse().unwrap()).collect();
            let (producer, at) = (parts[0], (parts[1], parts[2]));
            if let Some(prev) = last.insert(producer, at) {
                assert!(prev < at, "p{p}: {txn} stored after {prev:?}");
            }
        }
    }
    assert_eq!(
        total,
        PRODUCERS * PUSHES * 2,
        "every item stored exactly once"
    );
    for a in arbiters {
        a.stop();
    }
}
