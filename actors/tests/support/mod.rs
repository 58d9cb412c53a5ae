//! Test support for the actors: a [`FakeStore`] in place of PostgreSQL that records every
//! commit it is asked for, can hold commits behind a gate the test opens, and can fail chosen
//! commits as "unreachable"; and builders for items, committers and a spool in a temp dir.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use broker_actors::committer::{Committer, CommitterLimits, SegmentReady};
use broker_actors::error::StoreError;
use broker_actors::spool::{SpoolActor, SpoolHandle, SpoolState};
use broker_actors::store::{SegmentOutcome, SegmentStore, SegmentWrite};
use broker_actors::{Item, PartitionKey, Verdict};
use tokio::sync::{mpsc, Semaphore};
use uuid::Uuid;

/// One commit as the store saw it: per segment, the partition and the items' payloads.
pub type Batch = Vec<(PartitionKey, Vec<String>)>;

struct Shared {
    /// Permits for commits to finish; `None` lets every commit through at once.
    gate: Option<Semaphore>,
    /// Commit numbers (1-based) that fail as unreachable.
    failing: Mutex<HashSet<usize>>,
    /// Payloads PostgreSQL would refuse: a commit holding one fails (not as unreachable).
    poisoned: Mutex<HashSet<String>>,
    /// Every commit asked for, in order.
    commits: Mutex<Vec<Batch>>,
}

/// The test's side of a [`FakeStore`]: opens the gate, arms failures, reads what was asked.
pub struct StoreProbe {
    shared: Arc<Shared>,
    started: mpsc::UnboundedReceiver<Batch>,
}

/// A [`SegmentStore`] that answers every item `Queued` (partition id 1) unless told otherwise.
pub struct FakeStore {
    shared: Arc<Shared>,
    started: mpsc::UnboundedSender<Batch>,
}

/// A store whose commits finish only as the test opens the gate ([`StoreProbe::release`]).
pub fn gated_store() -> (FakeStore, StoreProbe) {
    store(Some(Semaphore::new(0)))
}

/// A store whose commits finish at once.
pub fn open_store() -> (FakeStore, StoreProbe) {
    store(None)
}

fn store(gate: Option<Semaphore>) -> (FakeStore, StoreProbe) {
    let shared = Arc::new(Shared {
        gate,
        failing: Mutex::default(),
        poisoned: Mutex::default(),
        commits: Mutex::default(),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    (
        FakeStore {
            shared: shared.clone(),
            started: tx,
        },
        StoreProbe {
            shared,
            started: rx,
        },
    )
}

impl SegmentStore for FakeStore {
    async fn commit(&mut self, batch: &[SegmentWrite]) -> Result<Vec<SegmentOutcome>, StoreError> {
        let seen: Batch = batch
            .iter()
            .map(|w| {
                let payloads = w.items.iter().map(|i| i.payload.to_string()).collect();
                (w.key.clone(), payloads)
            })
            .collect();
        let number = {
            let mut commits = self.shared.commits.lock().unwrap();
            commits.push(seen.clone());
            commits.len()
        };
        let _ = self.started.send(seen.clone());
        if let Some(gate) = &self.shared.gate {
            gate.acquire()
                .await
                .expect("the gate is never closed")
                .forget();
        }
        if self.shared.failing.lock().unwrap().contains(&number) {
            return Err(StoreError::Unavailable(format!(
                "commit {number}: connection refused"
            )));
        }
        let poisoned = self.shared.poisoned.lock().unwrap();
        if let Some(bad) = seen
            .iter()
            .flat_map(|(_, payloads)| payloads)
            .find(|p| poisoned.contains(*p))
        {
            return Err(StoreError::Refused(format!(
                "commit {number}: invalid byte sequence in {bad}"
            )));
        }
        Ok(batch
            .iter()
            .map(|w| SegmentOutcome {
                partition_id: 1,
                verdicts: vec![Verdict::Queued; w.items.len()],
            })
            .collect())
    }
}

impl StoreProbe {
    /// The next commit the store is asked for (the event of it starting).
    pub async fn next_commit(&mut self) -> Batch {
        self.started.recv().await.expect("the store is alive")
    }

    /// Lets `n` more commits finish.
    pub fn release(&self, n: usize) {
        self.shared
            .gate
            .as_ref()
            .expect("a gated store")
            .add_permits(n);
    }

    /// Makes commit number `n` (1-based) fail as unreachable.
    pub fn fail_commit(&self, n: usize) {
        self.shared.failing.lock().unwrap().insert(n);
    }

    /// Makes every commit holding an item with this payload fail as refused (not unreachable).
    pub fn poison(&self, payload: &str) {
        self.shared
            .poisoned
            .lock()
            .unwrap()
            .insert(payload.to_string());
    }

    /// Every commit asked for so far.
    pub fn commits(&self) -> Vec<Batch> {
        self.shared.commits.lock().unwrap().clone()
    }
}

/// An item with `payload` as its payload text and dedup key.
pub fn item(payload: &str) -> Item {
    Item {
        message_id: Uuid::now_v7(),
        transaction_id: payload.to_string(),
        payload: payload.into(),
        producer_sub: None,
        trace_id: None,
        arrived_at_micros: 1_700_000_000_000_000,
    }
}

/// Items with these payloads.
pub fn items(payloads: &[&str]) -> Vec<Item> {
    payloads.iter().map(|p| item(p)).collect()
}

/// `(partition, payloads)` for comparing with a [`Batch`].
pub fn seg(key: &PartitionKey, payloads: &[&str]) -> (PartitionKey, Vec<String>) {
    (
        key.clone(),
        payloads.iter().map(|p| p.to_string()).collect(),
    )
}

/// A committer on the current arbiter, with its load counter, as a pool takes it.
pub fn committer(
    id: usize,
    store: FakeStore,
    limits: CommitterLimits,
) -> (Recipient<SegmentReady>, Arc<AtomicUsize>) {
    let load = Arc::new(AtomicUsize::new(0));
    let addr = Committer::new(id, store, load.clone(), limits).start();
    (addr.recipient(), load)
}

/// A spool in a fresh temp dir (removed on drop).
pub struct TempSpool {
    /// What partition actors take.
    pub handle: SpoolHandle,
    /// Its directory.
    pub dir: PathBuf,
}

impl TempSpool {
    /// Opens a spool in a new directory under the system temp dir.
    pub fn open() -> Self {
        let dir = std::env::temp_dir().join(format!("actors-spool-{}", Uuid::now_v7().simple()));
        let state = Arc::new(SpoolState::default());
        let actor = SpoolActor::open(&dir, state.clone())
            .expect("a temp dir is usable")
            .start();
        Self {
            handle: SpoolHandle { actor, state },
            dir,
        }
    }
}

impl Drop for TempSpool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
