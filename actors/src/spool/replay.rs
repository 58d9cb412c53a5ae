//! `Replayer`: commits spooled records oldest-first once PostgreSQL answers.
//!
//! It works on sealed files only (the spool actor seals the active file on request). A batch of
//! records is grouped per partition, keeping file order, and committed in ONE transaction
//! through the same [`SegmentStore`] the committers use, with the original message ids and
//! transactionIds (so dedup makes a second replay harmless). Only after the commit is confirmed
//! does the file's watermark move (written to a temp file, fsynced, renamed); a fully replayed
//! file is deleted. Replay pauses while maintenance mode is on.
//!
//! No record holds back the others: when a batch's transaction is refused for a value in it
//! ([`StoreError::Refused`]: a data exception or an integrity violation, never a missing table
//! or a lock), each partition's segment is committed on its own, and each item of a segment
//! that still fails on its own; an item PostgreSQL refuses alone [`ITEM_ATTEMPTS`] times goes
//! to the [`quarantine`] file, logged with its ids, and its partition's later records go on. An
//! item its queue refuses (encrypted, no key on this broker) goes there too: a `buffered`
//! verdict is a promise, so no replayed record is ever dropped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::error::StoreError;
use crate::message::{Item, PartitionKey};
use crate::spool::quarantine::{self, Quarantined};
use crate::spool::record::{self, Record};
use crate::spool::{done_path, read_watermark, Seal, SpoolActor, SpoolState};
use crate::store::{SegmentStore, SegmentWrite};

/// Records committed per replay transaction at most.
pub const REPLAY_BATCH: usize = 2_000;

/// Times an item is committed on its own before a refusal sends it to the quarantine.
pub const ITEM_ATTEMPTS: usize = 3;

/// A spool file being replayed: its bytes (a sealed file is at most `MAX_FILE_BYTES`), where the
/// next record starts, and how many records are replayed. Records are decoded one batch at a
/// time, so replay holds the file once, not a decoded copy of all of it.
struct Loaded {
    path: PathBuf,
    bytes: Vec<u8>,
    at: usize,
    done: u64,
}

impl Loaded {
    fn finished(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

/// Replays the spool; see the module docs.
pub struct Replayer<S: SegmentStore> {
    store: Option<S>,
    spool: Addr<SpoolActor>,
    state: Arc<SpoolState>,
    current: Option<Loaded>,
    every: Duration,
    backoff: Duration,
    failures: u32,
    failed_unreachable: bool,
    next_try: Instant,
}

impl<S: SegmentStore> Replayer<S> {
    /// A replayer committing through `store`, checking for work every `every`; after `n`
    /// failed rounds in a row it waits `backoff` × 2^min(n, 4).
    pub fn new(
        store: S,
        spool: Addr<SpoolActor>,
        state: Arc<SpoolState>,
        every: Duration,
        backoff: Duration,
    ) -> Self {
        Self {
            store: Some(store),
            spool,
            state,
            current: None,
            every,
            backoff,
            failures: 0,
            failed_unreachable: false,
            next_try: Instant::now(),
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        // Back off after a failure, unless a committer has since reached PostgreSQL.
        let recovered = self.failed_unreachable && self.state.db_down_for().is_none();
        let backing_off = Instant::now() < self.next_try && !recovered;
        if self.state.maintenance() || self.state.records() == 0 || backing_off {
            return;
        }
        let Some(store) = self.store.take() else {
            return;
        }; // a round is running
        let current = self.current.take();
        let spool = self.spool.clone();
        let state = self.state.clone();
        let round = replay_round(store, current, spool, state);
        ctx.spawn(round.into_actor(self).map(|(store, current, outcome), act, ctx| {
            act.store = Some(store);
            act.current = current;
            match outcome {
                Round::Progress => {
                    act.failures = 0;
                    act.state.mark_db_up();
                    act.tick(ctx); // keep draining without waiting for the timer
                }
                Round::Idle => act.failures = 0,
                Round::Failed(e) => {
                    act.failed_unreachable = matches!(e, StoreError::Unavailable(_));
                    if act.failed_unreachable {
                        act.state.mark_db_down();
                    }
                    act.failures = act.failures.saturating_add(1);
                    let backoff = act.backoff * 2u32.pow(act.failures.min(4));
                    act.next_try = Instant::now() + backoff;
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "spool replay failed; will retry");
                }
            }
        }));
    }
}

enum Round {
    Progress,
    Idle,
    Failed(StoreError),
}

/// Loads the next file (if needed) and commits one batch of it.
async fn replay_round<S: SegmentStore>(
    mut store: S,
    current: Option<Loaded>,
    spool: Addr<SpoolActor>,
    state: Arc<SpoolState>,
) -> (S, Option<Loaded>, Round) {
    let mut loaded = match current {
        Some(loaded) if !loaded.finished() => loaded,
        _ => {
            let files = spool.send(Seal).await.unwrap_or_default();
            let Some(path) = files.into_iter().next() else {
                return (store, None, Round::Idle);
            };
            match load(path.clone()).await {
                Ok(loaded) => loaded,
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "cannot read spool file");
                    return (store, None, Round::Failed(StoreError::Transaction(e)));
                }
            }
        }
    };
    let (batch, damage, next) = record::decode_some(&loaded.bytes, loaded.at, REPLAY_BATCH);
    report_damage(&loaded.path, &damage);
    if batch.is_empty() {
        loaded.at = next;
        finish_file(&loaded, &state).await;
        return (store, None, Round::Progress);
    }
    let writes = group(&batch);
    match commit_isolating(&mut store, &writes).await {
        Ok(refused) => {
            if !refused.is_empty() {
                let n = refused.len() as u64;
                let Some(dir) = state.dir().map(std::path::Path::to_path_buf) else {
                    return (
                        store,
                        Some(loaded),
                        Round::Failed(StoreError::Transaction("spool has no directory".into())),
                    );
                };
                let entries = refused.clone();
                let saved =
                    tokio::task::spawn_blocking(move || quarantine::append(&dir, &entries)).await;
                if let Ok(Err(e)) | Err(e) = saved.map_err(|e| std::io::Error::other(e.to_string()))
                {
                    tracing::error!(error = %e, "cannot write the quarantine file; replay retries the batch");
                    return (
                        store,
                        Some(loaded),
                        Round::Failed(StoreError::Transaction(format!("quarantine: {e}"))),
                    );
                }
                state.add_quarantined(n);
                for q in &refused {
                    tracing::error!(
                        queue = %q.record.key.queue.escape_debug(),
                        partition = %q.record.key.partition.escape_debug(),
                        message_id = %q.record.item.message_id,
                        transaction_id = %q.record.item.transaction_id.escape_debug(),
                        error = %q.error,
                        "spooled record refused on replay; moved to the quarantine file"
                    );
                }
            }
            let path = loaded.path.clone();
            let watermark = loaded.done + batch.len() as u64;
            let saved =
                tokio::task::spawn_blocking(move || write_watermark(&path, watermark)).await;
            if let Ok(Err(e)) | Err(e) = saved.map_err(|e| std::io::Error::other(e.to_string())) {
                // The commit stands; a crash now replays this batch again, which dedup absorbs.
                tracing::error!(file = %loaded.path.display(), error = %e, "cannot save replay watermark");
            }
            for w in &writes {
                state.release(&w.key, w.items.len() as u64);
            }
            state
                .replayed
                .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::AcqRel);
            loaded.done = watermark;
            loaded.at = next;
            if loaded.finished() {
                finish_file(&loaded, &state).await;
                return (store, None, Round::Progress);
            }
            (store, Some(loaded), Round::Progress)
        }
        Err(e) => (store, Some(loaded), Round::Failed(e)),
    }
}

/// A replayed item its queue refused (encrypted, and this broker has no key; `maxSize` does not
/// refuse replayed items, see `PgStore::admitted`) is not stored and has no producer waiting to
/// hear it; it was answered `buffered`, a promise: it goes to the quarantine file with its
/// record and why, counted and logged there, never dropped.
fn refused_by_queue(
    writes: &[SegmentWrite],
    outcomes: &[crate::store::SegmentOutcome],
) -> Vec<Quarantined> {
    let mut kept = Vec::new();
    for (write, outcome) in writes.iter().zip(outcomes) {
        for (item, verdict) in write.items.iter().zip(&outcome.verdicts) {
            if let crate::Verdict::Refused(why) = verdict {
                kept.push(Quarantined {
                    record: Record {
                        key: write.key.clone(),
                        item: item.clone(),
                    },
                    error: why.message(&write.key.queue),
                });
            }
        }
    }
    kept
}

fn report_damage(path: &std::path::Path, damage: &[record::Damage]) {
    for d in damage {
        tracing::error!(file = %path.display(), at = d.at, skipped = d.skipped, reason = d.reason,
            "damaged spool data skipped (torn or corrupt record)");
    }
}

/// Commits `writes` in one transaction; when that fails for a reason other than PostgreSQL
/// being unreachable, each segment on its own, and a segment that still fails item by item.
/// Returns the items PostgreSQL refused on their own and those their queue refused
/// ([`refused_by_queue`]), for the quarantine; everything else is committed.
///
/// # Errors
///
/// Any error other than [`StoreError::Refused`] (PostgreSQL unreachable, a table missing, a
/// lock timeout): the batch is retried whole later; what did commit meanwhile is absorbed by
/// dedup.
async fn commit_isolating<S: SegmentStore>(
    store: &mut S,
    writes: &[SegmentWrite],
) -> Result<Vec<Quarantined>, StoreError> {
    let first = match store.commit(writes).await {
        Ok(outcomes) => return Ok(refused_by_queue(writes, &outcomes)),
        Err(e @ StoreError::Refused(_)) => e,
        // Unreachable, or a failure that is not the data's (a missing table before the
        // migrations ran, a lock timeout): the batch is retried whole with back-off.
        Err(e) => return Err(e),
    };
    tracing::warn!(error = %first, segments = writes.len(),
        "spool replay batch refused; committing its partitions one by one");
    let mut refused = Vec::new();
    for write in writes {
        let error = match store.commit(std::slice::from_ref(write)).await {
            Ok(outcomes) => {
                refused.extend(refused_by_queue(std::slice::from_ref(write), &outcomes));
                continue;
            }
            Err(e @ StoreError::Refused(_)) => e,
            Err(e) => return Err(e),
        };
        if write.items.len() == 1 {
            refused.extend(refuse_alone(store, write, error).await?);
            continue;
        }
        for item in &write.items {
            let single = SegmentWrite {
                key: write.key.clone(),
                partition_id: None,
                items: vec![item.clone()],
            };
            match store.commit(std::slice::from_ref(&single)).await {
                Ok(outcomes) => {
                    refused.extend(refused_by_queue(std::slice::from_ref(&single), &outcomes))
                }
                Err(e @ StoreError::Refused(_)) => {
                    refused.extend(refuse_alone(store, &single, e).await?)
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(refused)
}

/// A one-item segment refused once: tried again up to [`ITEM_ATTEMPTS`] in all; the entry for
/// the quarantine when every try is refused.
async fn refuse_alone<S: SegmentStore>(
    store: &mut S,
    single: &SegmentWrite,
    mut error: StoreError,
) -> Result<Option<Quarantined>, StoreError> {
    for attempt in 1..ITEM_ATTEMPTS {
        tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
        match store.commit(std::slice::from_ref(single)).await {
            Ok(outcomes) => {
                return Ok(refused_by_queue(std::slice::from_ref(single), &outcomes).pop());
            }
            Err(e @ StoreError::Refused(_)) => error = e,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(Quarantined {
        record: Record {
            key: single.key.clone(),
            item: single.items[0].clone(),
        },
        error: error.to_string(),
    }))
}

/// Groups a batch into one segment per partition, keeping file order inside each.
fn group(batch: &[Record]) -> Vec<SegmentWrite> {
    let mut writes: Vec<SegmentWrite> = Vec::new();
    let mut index: std::collections::HashMap<&PartitionKey, usize> =
        std::collections::HashMap::new();
    for r in batch {
        let at = *index.entry(&r.key).or_insert_with(|| {
            writes.push(SegmentWrite {
                key: r.key.clone(),
                partition_id: None,
                items: Vec::new(),
            });
            writes.len() - 1
        });
        writes[at].items.push(Item::clone(&r.item));
    }
    writes
}

async fn load(path: PathBuf) -> Result<Loaded, String> {
    tokio::task::spawn_blocking(move || {
        let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
        // Skip what an earlier run already replayed (the watermark counts intact records).
        let done = read_watermark(&path);
        let (skipped, damage, at) = record::decode_some(&bytes, 0, done as usize);
        report_damage(&path, &damage);
        Ok(Loaded {
            done: skipped.len() as u64,
            at,
            bytes,
            path,
        })
    })
    .await
    .map_err(|e| e.to_string())?
}

fn write_watermark(file: &std::path::Path, done: u64) -> std::io::Result<()> {
    use std::io::Write;
    let target = done_path(file);
    let mut tmp = target.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&done.to_le_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &target)?;
    if let Some(dir) = file.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

async fn finish_file(loaded: &Loaded, state: &SpoolState) {
    let path = loaded.path.clone();
    let removed = tokio::task::spawn_blocking(move || {
        std::fs::remove_file(&path)?;
        let _ = std::fs::remove_file(done_path(&path));
        Ok::<_, std::io::Error>(())
    })
    .await;
    match removed {
        Ok(Ok(())) => {
            state.sub_bytes(loaded.bytes.len() as u64);
            // Room on the spool's disk again: new spool writes may be tried.
            state.set_disk_full(false);
            tracing::info!(file = %loaded.path.display(), records = loaded.done, "spool file replayed and removed");
        }
        Ok(Err(e)) => {
            tracing::error!(file = %loaded.path.display(), error = %e, "cannot remove replayed spool file")
        }
        Err(e) => {
            tracing::error!(file = %loaded.path.display(), error = %e, "cannot remove replayed spool file")
        }
    }
}

impl<S: SegmentStore> Actor for Replayer<S> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.every, |act, ctx| act.tick(ctx));
    }
}
